#!/usr/bin/env bash
# A causal LM fine-tuned as a sequence classifier (transformers' LlamaForSequenceClassification) on sentence pairs
# in GLUE MRPC's format, from a Hugging Face model directory with its tokenizer.json, and the result loaded back into
# transformers:
#   1. synthetic data: caption pairs in MRPC's TSV layout, Quality 1 when both describe the same scene
#      (`shardtrain data synth --pairs`), and captions to train the tokenizer on (--seq2seq)
#   2. a random LlamaForCausalLM and a Llama 3-style byte-level BPE tokenizer.json (../llama_causal_lm/make_model.py)
#   3. fine-tuned as a classifier on 2 ranks (model.task: classify): score created on each pair's last token, the
#      LM head left; accuracy and F1 on the held-out pairs every 100 steps
#   4. exported (a LlamaForSequenceClassification directory: id2label, pad_token_id) and scored on the held-out
#      pairs by transformers' AutoModelForSequenceClassification (../bert_classify/check.py)
# usage: examples/llama_classify/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/llama_classify); under a minute
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/llama_classify}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 0 --image-text 0 --image 0 --eval 0 --seq2seq 4000 --pairs 4000
"$python" "$here/../llama_causal_lm/make_model.py" "$out/hf-random" "$out/data/seq2seq/train.jsonl"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/classify.yaml" --model.from="$out/hf-random" \
  --data.text="[$out/data/pairs/train.tsv]" --data.eval="[$out/data/pairs/eval.tsv]" --checkpoint.dir="$out/classify"
"$st" checkpoint export "$out/classify" --hf "$out/hf-classifier"
"$python" "$here/../bert_classify/check.py" "$out/hf-classifier" "$out/data/pairs/eval.tsv" 0.8
