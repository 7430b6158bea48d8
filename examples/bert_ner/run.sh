#!/usr/bin/env bash
# Named-entity recognition (token classification, as transformers' run_ner) fine-tuned from a Hugging Face model
# directory on CoNLL-2003's own file format, and the result loaded back into transformers:
#   1. synthetic captions (`shardtrain data synth --pairs`) tagged as CoNLL files: objects (size, colour, shape
#      words) and locations (make_conll.py)
#   2. a random BertForMaskedLM written by transformers (../bert_classify/make_model.py)
#   3. the tagger fine-tuned from it on 2 ranks: a classifier on every token created, the masked-LM head unused;
#      seqeval's entity precision, recall and F1 on the held-out sentences every 100 steps
#   4. exported as a BertForTokenClassification, scored on the held-out sentences by transformers and seqeval, and
#      run in transformers' token-classification pipeline (check.py)
# usage: examples/bert_ner/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, runs/bert_ner); about a minute
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-runs/bert_ner}
python=${PYTHON:-$here/../../.venv/bin/python}
st=$build/shardtrain
rm -rf "$out"
mkdir -p "$out"

"$st" data synth --out "$out/data" --text 0 --image-text 0 --image 0 --eval 0 --pairs 4000 --vocab-size 400
"$python" "$here/make_conll.py" "$out/data/pairs" "$out/conll"
"$python" "$here/../bert_classify/make_model.py" "$out/hf-random" "$out/data/vocab.txt"
"$st" launch --nproc-per-node 2 -- "$st" train "$here/ner.yaml" --model.from="$out/hf-random" \
  --data.text="[$out/conll/train.conll]" --data.eval="[$out/conll/valid.conll]" --checkpoint.dir="$out/ner"
"$st" checkpoint export "$out/ner" --hf "$out/hf-tagger"
"$python" "$here/check.py" "$out/hf-tagger" "$out/conll/valid.conll" 0.9
