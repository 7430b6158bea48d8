#!/usr/bin/env bash
# BERT sentence-pair classification (GLUE MRPC's format) fine-tuned from a Hugging Face model directory, and the
# result loaded back into transformers:
#   1. synthetic data: captions of shapes (for pretraining) and caption pairs in MRPC's TSV layout, Quality 1 when
#      both describe the same scene (`shardtrain data synth --pairs`)
#   2. a random BertForMaskedLM written by transformers (make_model.py)
#   3. a short masked-LM pretraining from that directory on 2 ranks, exported as a Hugging Face directory
#   4. the classifier fine-tuned from the export on 2 ranks: the classifier head created, the masked-LM head unused;
#      accuracy and F1 on the held-out pairs every 100 steps
#   5. exported, and scored on the held-out pairs by transformers' AutoModelForSequenceClassification (check.py)
# usage: examples/bert_classify/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/bert_classify); about 1 minute
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/bert_classify}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 4000 --image-text 0 --image 0 --eval 0 --pairs 4000 --vocab-size 400
"$python" "$here/make_model.py" "$out/hf-random" "$out/data/vocab.txt"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/pretrain.yaml" --model.from="$out/hf-random" \
  --data.text="[$out/data/text]" --checkpoint.dir="$out/pretrain"
"$st" checkpoint export "$out/pretrain" --hf "$out/hf-pretrained"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/classify.yaml" --model.from="$out/hf-pretrained" \
  --data.text="[$out/data/pairs/train.tsv]" --data.eval="[$out/data/pairs/eval.tsv]" --checkpoint.dir="$out/classify"
"$st" checkpoint export "$out/classify" --hf "$out/hf-classifier"
"$python" "$here/check.py" "$out/hf-classifier" "$out/data/pairs/eval.tsv" 0.65
