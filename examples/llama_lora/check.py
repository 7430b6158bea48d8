"""PEFT's verdict on the adapter: loads the base model directory with AutoModelForCausalLM and the adapter over it
with PeftModel.from_pretrained (as a user of PEFT would), measures the perplexity of every held-out text (loss per
predicted token over all of them) and fails unless it is below `ratio` times the base model's; then loads the merged
directory and fails unless its outputs are the adapted model's.

usage: check.py BASE_DIR ADAPTER_DIR MERGED_DIR EVAL_JSONL MAX_RATIO
"""
import json
import math
import sys

import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def perplexity(model, batches):
    loss, tokens = 0.0, 0
    with torch.no_grad():
        for ids in batches:
            n = ids.numel() - 1  # predicted tokens
            loss += model(input_ids=ids, labels=ids).loss.item() * n
            tokens += n
    return math.exp(loss / tokens)


def main(base_dir, adapter_dir, merged_dir, eval_jsonl, ratio):
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    with open(eval_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["input"] for line in f]
    batches = [tokenizer(t, truncation=True, max_length=48, return_tensors="pt").input_ids for t in texts]
    base = perplexity(AutoModelForCausalLM.from_pretrained(base_dir).eval(), batches)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    tuned = perplexity(adapted, batches)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with torch.no_grad():
        diff = max((adapted(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max().item()
                   for ids in batches[:16])
    trainable = sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n)
    print(f"check: PEFT's {type(adapted.get_base_model()).__name__} with the adapter from {adapter_dir} "
          f"({trainable:,} adapter parameters): perplexity {tuned:.3f} on {len(texts)} held-out texts (the base "
          f"model's {base:.3f}; bar {ratio} x); the merged model's logits within {diff:.1e}")
    if tuned > ratio * base:
        raise SystemExit(f"check: perplexity {tuned:.3f} is above {ratio} x {base:.3f}")
    if diff > 1e-4:
        raise SystemExit(f"check: the merged model's logits differ from the adapted model's by {diff:.2e}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
