"""transformers' scores of an exported multi-label classifier (a BertForSequenceClassification with problem_type
multi_label_classification, as fine-tuned on go_emotions) over a held-out dataset, for tests/train/train_test.cpp to
compare with the evaluation shardtrain printed for the same weights: the loss transformers' own model gives (binary
cross-entropy on every output, BCEWithLogitsLoss), micro F1 of the outputs above 0 (as run_classification scores a
multi-label task: f1 with average="micro") and the subset accuracy (every class of a sample right).

usage: multilabel_check.py EXPORT_DIR DATASET_DIR VOCAB MAX_LENGTH   (prints one JSON line)
"""
import json
import sys

import datasets
import torch
import transformers
from transformers import BertForSequenceClassification, BertTokenizerFast

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def main(export, data, vocab, max_length):
    model = BertForSequenceClassification.from_pretrained(export).eval()
    if model.config.problem_type != "multi_label_classification":
        raise SystemExit(f"{export}: problem_type {model.config.problem_type}")
    ds = datasets.load_from_disk(data)
    names = ds.features["labels"].feature.names
    if [model.config.id2label[i] for i in range(model.config.num_labels)] != names:
        raise SystemExit(f"{export}: id2label {model.config.id2label}, the dataset's classes {names}")
    tok = BertTokenizerFast(vocab, do_lower_case=True)
    enc = tok(list(ds["text"]), truncation=True, max_length=int(max_length), padding="max_length",
              return_tensors="pt")
    truth = torch.zeros(len(ds), len(names))
    for row, ids in enumerate(ds["labels"]):
        truth[row, ids] = 1
    with torch.no_grad():
        out = model(**enc, labels=truth)
    predicted = (out.logits > 0).float()
    hits, total = (predicted * truth).sum().item(), (predicted.sum() + truth.sum()).item()
    print(json.dumps({"eval_loss": out.loss.item(), "f1": 2 * hits / total if total else 0.0,
                      "accuracy": (predicted == truth).all(1).float().mean().item(), "samples": len(ds)}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
