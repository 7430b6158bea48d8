#!/usr/bin/env bash
# The seeds' GPT-2 language modelling (transformers' run_clm, 2 processes under DDP, 4 blocks per device, 200 steps)
# fine-tuned from a Hugging Face model directory with its tokenizer.json, and the result scored again by
# transformers:
#   1. synthetic texts: captions of scenes of shapes (`shardtrain data synth --seq2seq`: the "input" fields)
#   2. a random GPT2LMHeadModel and a GPT-2-style byte-level BPE tokenizer.json, written by transformers and
#      tokenizers (make_model.py)
#   3. trained on 2 ranks (model.task: causal_lm, data.packing: run_clm's blocks of 64 tokens); eval loss and
#      perplexity on the held-out texts grouped the same way
#   4. exported, and the held-out perplexity measured by transformers on run_clm's blocks (check.py)
#   5. the first words of 8 held-out captions continued by `shardtrain generate` (greedy, KV cache), and by
#      transformers' generate from the same directory: the same tokens (check.py)
# usage: examples/gpt2_clm/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/gpt2_clm); about 1 minute
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/gpt2_clm}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 0 --image-text 0 --image 0 --eval 0 --seq2seq 4000
"$python" "$here/make_model.py" "$out/hf-random" "$out/data/seq2seq/train.jsonl"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/clm.yaml" --model.from="$out/hf-random" \
  --data.text="[$out/data/seq2seq/train.jsonl]" --data.eval="[$out/data/seq2seq/eval.jsonl]" \
  --data.cache_dir="$out/cache" --checkpoint.dir="$out/clm"
"$st" checkpoint export "$out/clm" --hf "$out/hf-clm"
head -n 8 "$out/data/seq2seq/eval.jsonl" | "$python" -c '
import json, sys
for line in sys.stdin:
    print(" ".join(json.loads(line)["input"].split()[:3]))' > "$out/prompts.txt"
"$st" generate "$out/hf-clm" --prompts "$out/prompts.txt" --max-new-tokens 24 --json > "$out/generated.jsonl"
"$python" "$here/check.py" "$out/hf-clm" "$out/hf-random" "$out/data/seq2seq/eval.jsonl" 64 0.2 "$out/generated.jsonl"
