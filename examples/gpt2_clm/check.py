"""transformers' verdict on the fine-tuned GPT-2, as run_clm scores it: loads the exported directory and the random
one it started from with AutoTokenizer and AutoModelForCausalLM, tokenizes every held-out text, joins them end to
end and cuts the stream into blocks of BLOCK tokens (run_clm's group_texts; the remainder dropped), and prints each
model's perplexity over the blocks (exp of the mean loss per predicted token); fails unless the fine-tuned one is
below MAX_RATIO times the random one's. Then each prompt of GENERATED_JSONL (`shardtrain generate --json`'s records)
continued by transformers' generate (greedy, as many new tokens as shardtrain made or up to an end-of-sequence
token): fails unless it makes the same tokens and text.

usage: check.py TRAINED_DIR RANDOM_DIR EVAL_JSONL BLOCK MAX_RATIO GENERATED_JSONL
"""
import json
import math
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def perplexity(model_dir, texts, block):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    stream = [t for text in texts for t in tokenizer(text)["input_ids"]]
    blocks = torch.tensor(stream[: len(stream) // block * block]).view(-1, block)
    with torch.no_grad():
        loss = sum(model(input_ids=b[None], labels=b[None]).loss.item() for b in blocks) / len(blocks)
    return math.exp(loss), len(blocks), type(model).__name__


def check_generated(model_dir, generated_jsonl):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with open(generated_jsonl, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    for r in records:
        ids = tokenizer(r["prompt"], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=len(r["tokens"]), pad_token_id=tokenizer.eos_token_id)
        theirs = out[0, ids.shape[1]:].tolist()
        text = tokenizer.decode(theirs, skip_special_tokens=True)
        if theirs != r["tokens"] or text != r["completion"]:
            raise SystemExit(f"check: {r['prompt']!r}: shardtrain generated {r['tokens']} {r['completion']!r}, "
                             f"transformers {theirs} {text!r}")
    print(f"check: {len(records)} of {len(records)} completions as transformers' generate, e.g. "
          f"{records[0]['prompt']!r} -> {records[0]['completion']!r}")


def main(trained, random_dir, eval_jsonl, block, ratio, generated_jsonl):
    with open(eval_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["input"] for line in f]
    fine, blocks, name = perplexity(trained, texts, block)
    start, _, _ = perplexity(random_dir, texts, block)
    print(f"check: transformers' {name} from {trained}: perplexity {fine:.3f} on {blocks} held-out blocks of {block} "
          f"tokens (the random model's {start:.3f}; bar {ratio} x)")
    if fine > ratio * start:
        raise SystemExit(f"check: perplexity {fine:.3f} is above {ratio} x {start:.3f}")
    check_generated(trained, generated_jsonl)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
