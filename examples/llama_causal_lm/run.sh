#!/usr/bin/env bash
# Llama causal language modelling fine-tuned from a Hugging Face model directory with its tokenizer.json, and the
# result loaded back into transformers:
#   1. synthetic texts: captions of scenes of shapes (`shardtrain data synth --seq2seq`: the "input" fields)
#   2. a random LlamaForCausalLM and a Llama 3-style byte-level BPE tokenizer.json, written by transformers and
#      tokenizers (make_model.py)
#   3. fine-tuned on 2 ranks (model.task: causal_lm); eval loss and perplexity on the held-out texts
#   4. exported, and the held-out perplexity measured by transformers against the random model's (check.py)
# usage: examples/llama_causal_lm/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/llama_causal_lm); about 1 minute
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/llama_causal_lm}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 0 --image-text 0 --image 0 --eval 0 --seq2seq 4000
"$python" "$here/make_model.py" "$out/hf-random" "$out/data/seq2seq/train.jsonl"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/causal_lm.yaml" --model.from="$out/hf-random" \
  --data.text="[$out/data/seq2seq/train.jsonl]" --data.eval="[$out/data/seq2seq/eval.jsonl]" \
  --checkpoint.dir="$out/causal_lm"
"$st" checkpoint export "$out/causal_lm" --hf "$out/hf-causal-lm"
"$python" "$here/check.py" "$out/hf-causal-lm" "$out/hf-random" "$out/data/seq2seq/eval.jsonl" 0.1
