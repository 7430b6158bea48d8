"""transformers' verdict on the fine-tuned tagger: loads the exported directory with AutoTokenizer and
AutoModelForTokenClassification (as a user of the Hub would), tags the held-out CoNLL sentences (the words
tokenized with is_split_into_words, each word's tag read at its first token, as run_ner scores), and fails unless
seqeval's entity F1 reaches the bar; then shows the token-classification pipeline on one sentence.

usage: check.py MODEL_DIR VALID_CONLL MIN_F1
"""
import sys

import torch
import transformers
from seqeval.metrics import f1_score
from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def sentences(path):
    words, tags = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    yield words, tags
                words, tags = [], []
                continue
            fields = line.split()
            words.append(fields[0])
            tags.append(fields[-1])
    if words:
        yield words, tags


def main(model_dir, valid, bar):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval()
    truth, predicted = [], []
    with torch.no_grad():
        for words, tags in sentences(valid):
            enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=48, return_tensors="pt")
            ids = model(**enc).logits.argmax(-1)[0].tolist()
            seen, row = set(), []
            for k, w in enumerate(enc.word_ids()):
                if w is not None and w not in seen:
                    seen.add(w)
                    row.append(model.config.id2label[ids[k]])
            truth.append(tags[:len(row)])
            predicted.append(row)
    f1 = f1_score(truth, predicted)
    print(f"check: transformers' {type(model).__name__} from {model_dir}: entity F1 {f1:.3f} on {len(truth)} "
          f"held-out sentences (seqeval, bar {bar})")
    tagger = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="simple")
    sentence = "we see two small red circles at the top"
    print(f"check: {sentence!r} -> " +
          ", ".join(f"{e['entity_group']} {e['word']!r}" for e in tagger(sentence)))
    if f1 < bar:
        raise SystemExit(f"check: entity F1 {f1:.3f} is below {bar}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
