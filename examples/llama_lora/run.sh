#!/usr/bin/env bash
# LoRA fine-tuning of a Llama from a Hugging Face model directory, and the adapter loaded back by PEFT:
#   1. synthetic texts: captions of scenes of shapes (`shardtrain data synth --seq2seq`: the "input" fields)
#   2. a random LlamaForCausalLM and its byte-level BPE tokenizer.json, written by transformers and tokenizers
#      (examples/llama_causal_lm/make_model.py)
#   3. LoRA adapters on every Linear of its layers trained on 2 ranks (lora.yaml), the base frozen
#   4. exported twice: the adapter as PEFT's save_pretrained writes it (--peft) and the model with the adapters
#      merged (--hf); PEFT loads the adapter over the base model and measures the held-out perplexity, which must
#      fall below `ratio` times the base model's, and the merged model gives the same outputs (check.py)
# usage: examples/llama_lora/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/llama_lora); about 1 minute
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/llama_lora}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 0 --image-text 0 --image 0 --eval 0 --seq2seq 4000
"$python" "$here/../llama_causal_lm/make_model.py" "$out/hf-base" "$out/data/seq2seq/train.jsonl"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/lora.yaml" --model.from="$out/hf-base" \
  --data.text="[$out/data/seq2seq/train.jsonl]" --data.eval="[$out/data/seq2seq/eval.jsonl]" \
  --checkpoint.dir="$out/lora"
"$st" checkpoint export "$out/lora" --peft "$out/adapter"
"$st" checkpoint export "$out/lora" --hf "$out/hf-merged"
"$python" "$here/check.py" "$out/hf-base" "$out/adapter" "$out/hf-merged" "$out/data/seq2seq/eval.jsonl" 0.7
