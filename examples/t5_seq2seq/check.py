"""transformers' verdict on the fine-tuned T5: loads the exported directory with AutoTokenizer and
AutoModelForSeq2SeqLM (as a user of the Hub would), generates greedily for every held-out input and fails unless the
share of outputs equal to their targets reaches the bar; then fails unless `shardtrain generate --json`'s output for
the same inputs (GENERATED_JSONL) is transformers' output, input by input.

usage: check.py MODEL_DIR EVAL_JSONL MIN_EXACT_MATCH GENERATED_JSONL
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def main(model_dir, eval_jsonl, bar, generated_jsonl):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    with open(eval_jsonl, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    exact, outputs = 0, []
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            batch = rows[start:start + 64]
            inputs = tokenizer([r["input"] for r in batch], padding=True, truncation=True, max_length=96,
                               return_tensors="pt")
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False, num_beams=1)
            texts = [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
            exact += sum(t == r["target"] for t, r in zip(texts, batch))
            outputs += texts
    score = exact / len(rows)
    print(f"check: transformers' {type(model).__name__} from {model_dir}: exact match {score:.3f} on {len(rows)} "
          f"held-out inputs (bar {bar}); e.g. '{rows[0]['input']}' -> '{outputs[0]}'")
    if score < bar:
        raise SystemExit(f"check: exact match {score:.3f} is below {bar}")
    with open(generated_jsonl, encoding="utf-8") as f:
        ours = [json.loads(line)["completion"].strip() for line in f]
    differ = [(r["input"], o, t) for r, o, t in zip(rows, ours, outputs) if o != t]
    print(f"check: shardtrain generate: {len(ours) - len(differ)} of {len(rows)} outputs as transformers' generate")
    if len(ours) != len(rows) or differ:
        raise SystemExit(f"check: shardtrain generate differs from transformers on {len(differ)} inputs, e.g. "
                         f"{differ[:1]} (input, shardtrain's, transformers')")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
