"""transformers' scores of an exported regression (a BertForSequenceClassification with one output, as fine-tuned on
GLUE STS-B) over a held-out dataset, for tests/train/train_test.cpp to compare with the evaluation shardtrain printed
for the same weights: the mean squared error transformers' own loss gives (problem_type regression), and Pearson's
and Spearman's correlations of the predictions with the scores (pandas': Spearman as Pearson's of the ranks, ties
averaged, as scipy.stats.spearmanr and run_glue's metric compute it).

usage: regression_check.py EXPORT_DIR DATASET_DIR VOCAB MAX_LENGTH   (prints one JSON line)
"""
import json
import sys

import datasets
import pandas as pd
import torch
import transformers
from transformers import BertForSequenceClassification, BertTokenizerFast

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def main(export, data, vocab, max_length):
    model = BertForSequenceClassification.from_pretrained(export).eval()
    if model.config.problem_type != "regression" or model.config.num_labels != 1:
        raise SystemExit(f"{export}: problem_type {model.config.problem_type}, num_labels {model.config.num_labels}")
    ds = datasets.load_from_disk(data)
    tok = BertTokenizerFast(vocab, do_lower_case=True)
    enc = tok(list(ds["sentence1"]), list(ds["sentence2"]), truncation=True, max_length=int(max_length),
              padding="max_length", return_tensors="pt")
    scores = torch.tensor(list(ds["label"]), dtype=torch.float32)
    with torch.no_grad():
        out = model(**enc, labels=scores)
    predicted, truth = pd.Series(out.logits.squeeze(-1).double().numpy()), pd.Series(scores.double().numpy())
    print(json.dumps({"eval_loss": out.loss.item(), "pearson": predicted.corr(truth),
                      "spearmanr": predicted.rank().corr(truth.rank()), "samples": len(ds)}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
