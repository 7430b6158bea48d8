"""transformers' verdict on the fine-tuned Llama: loads the exported directory and the random one it started from
with AutoTokenizer and AutoModelForCausalLM (as a user of the Hub would), measures the perplexity of every held-out
text (loss per predicted token over all of them) and fails unless the fine-tuned one is below `ratio` times the
random one's.

usage: check.py TRAINED_DIR RANDOM_DIR EVAL_JSONL MAX_RATIO
"""
import json
import math
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def perplexity(model_dir, texts):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    loss, tokens = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=48, return_tensors="pt").input_ids
            n = ids.numel() - 1  # predicted tokens
            loss += model(input_ids=ids, labels=ids).loss.item() * n
            tokens += n
    return math.exp(loss / tokens), type(model).__name__


def main(trained, random_dir, eval_jsonl, ratio):
    with open(eval_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["input"] for line in f]
    fine, name = perplexity(trained, texts)
    start, _ = perplexity(random_dir, texts)
    print(f"check: transformers' {name} from {trained}: perplexity {fine:.3f} on {len(texts)} held-out texts "
          f"(the random model's {start:.3f}; bar {ratio} x)")
    if fine > ratio * start:
        raise SystemExit(f"check: perplexity {fine:.3f} is above {ratio} x {start:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
