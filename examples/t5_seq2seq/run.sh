#!/usr/bin/env bash
# T5 sequence-to-sequence fine-tuning from a Hugging Face model directory with its tokenizer.json, and the result
# loaded back into transformers:
#   1. synthetic (input, target) records: a scene's caption, and the description of its first object
#      (`shardtrain data synth --seq2seq`)
#   2. a random T5ForConditionalGeneration and a T5-style Unigram tokenizer.json, written by transformers and
#      tokenizers (make_model.py)
#   3. fine-tuned on 2 ranks (model.task: seq2seq, teacher forcing); eval loss, exact match and ROUGE-L of greedy
#      outputs on the held-out records
#   4. exported, and scored on the held-out records by transformers' generate (check.py)
#   5. the held-out inputs continued by `shardtrain generate` (greedy, KV cache): transformers' outputs (check.py)
# usage: examples/t5_seq2seq/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/t5_seq2seq); about 3 minutes
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/t5_seq2seq}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 0 --image-text 0 --image 0 --eval 0 --seq2seq 4000
"$python" "$here/make_model.py" "$out/hf-random" "$out/data/seq2seq/train.jsonl"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/seq2seq.yaml" --model.from="$out/hf-random" \
  --data.text="[$out/data/seq2seq/train.jsonl]" --data.eval="[$out/data/seq2seq/eval.jsonl]" \
  --checkpoint.dir="$out/seq2seq"
"$st" checkpoint export "$out/seq2seq" --hf "$out/hf-seq2seq"
"$st" generate "$out/hf-seq2seq" --prompts "$out/data/seq2seq/eval.jsonl" --max-new-tokens 24 --batch-size 64 \
  --json > "$out/generated.jsonl"
"$python" "$here/check.py" "$out/hf-seq2seq" "$out/data/seq2seq/eval.jsonl" 0.25 "$out/generated.jsonl"
