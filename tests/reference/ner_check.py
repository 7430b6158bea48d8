"""transformers' scores of an exported token classifier (a BertForTokenClassification, as run_ner fine-tunes one on
CoNLL-2003) over a held-out dataset of words and IOB tags, for tests/train/train_test.cpp to compare with the
evaluation shardtrain printed for the same weights. Everything as run_ner does it: the words tokenized with
is_split_into_words, each word's tag on its first token and -100 on the rest (label_all_tokens off), the loss
transformers' own model gives over those tokens, and seqeval's overall precision, recall, F1 and accuracy of the tags
predicted there.

usage: ner_check.py EXPORT_DIR DATASET_DIR VOCAB MAX_LENGTH [label_all_tokens]   (prints one JSON line)
With label_all_tokens, a word's other tokens take its tag too, a B- tag as its I- tag (run_ner's b_to_i_label), and
are scored.
"""
import json
import sys

import datasets
import torch
import transformers
from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
from transformers import BertForTokenClassification, BertTokenizerFast

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def main(export, data, vocab, max_length, all_tokens=""):
    model = BertForTokenClassification.from_pretrained(export).eval()
    ds = datasets.load_from_disk(data)
    names = ds.features["ner_tags"].feature.names
    if [model.config.id2label[i] for i in range(model.config.num_labels)] != names:
        raise SystemExit(f"{export}: id2label {model.config.id2label}, the dataset's classes {names}")
    tok = BertTokenizerFast(vocab, do_lower_case=True)
    enc = tok(list(ds["tokens"]), is_split_into_words=True, truncation=True, max_length=int(max_length),
              padding="max_length", return_tensors="pt")
    b_to_i = [names.index("I-" + n[2:]) if n.startswith("B-") and "I-" + n[2:] in names else i
              for i, n in enumerate(names)]
    labels = []
    for row, tags in enumerate(ds["ner_tags"]):
        previous, aligned = None, []
        for word in enc.word_ids(batch_index=row):
            if word is None:
                aligned.append(-100)
            elif word != previous:
                aligned.append(tags[word])
            else:
                aligned.append(b_to_i[tags[word]] if all_tokens == "label_all_tokens" else -100)
            previous = word
        labels.append(aligned)
    labels = torch.tensor(labels)
    with torch.no_grad():
        out = model(**enc, labels=labels)
    predicted = out.logits.argmax(-1)
    truth_tags, predicted_tags = [], []
    for t_row, p_row in zip(labels.tolist(), predicted.tolist()):
        truth_tags.append([names[t] for t in t_row if t != -100])
        predicted_tags.append([names[p] for t, p in zip(t_row, p_row) if t != -100])
    split_words = sum(1 for row in range(len(ds)) for w in set(enc.word_ids(batch_index=row))
                      if w is not None and enc.word_ids(batch_index=row).count(w) > 1)
    print(json.dumps({"eval_loss": out.loss.item(), "precision": precision_score(truth_tags, predicted_tags),
                      "recall": recall_score(truth_tags, predicted_tags), "f1": f1_score(truth_tags, predicted_tags),
                      "accuracy": accuracy_score(truth_tags, predicted_tags), "samples": len(ds),
                      "split_words": split_words}))


if __name__ == "__main__":
    main(*sys.argv[1:6])
