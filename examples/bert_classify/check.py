"""transformers' verdict on the fine-tuned classifier: loads the exported directory with AutoTokenizer and
AutoModelForSequenceClassification (as a user of the Hub would), classifies every held-out pair of the TSV file and
fails unless the accuracy reaches the bar. BERT's (bert_classify) and a causal LM's (llama_classify: padded with the
config's pad_token_id, by which transformers finds each pair's last token).

usage: check.py MODEL_DIR EVAL_TSV MIN_ACCURACY
"""
import csv
import sys

import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def main(model_dir, eval_tsv, bar):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    if tokenizer.pad_token is None:  # a causal LM's tokenizer has none: pad as the classifier's config says
        tokenizer.pad_token_id = model.config.pad_token_id
    with open(eval_tsv, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    correct = 0
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            batch = rows[start:start + 64]
            inputs = tokenizer([r["#1 String"] for r in batch], [r["#2 String"] for r in batch], padding=True,
                               truncation=True, max_length=48, return_tensors="pt")
            predicted = model(**inputs).logits.argmax(-1)
            correct += sum(int(p) == int(r["Quality"]) for p, r in zip(predicted.tolist(), batch))
    accuracy = correct / len(rows)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    print(f"check: transformers' {type(model).__name__} ({', '.join(labels)}) from {model_dir}: accuracy "
          f"{accuracy:.3f} on {len(rows)} held-out pairs (chance 0.5, bar {bar})")
    if accuracy < bar:
        raise SystemExit(f"check: accuracy {accuracy:.3f} is below {bar}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
