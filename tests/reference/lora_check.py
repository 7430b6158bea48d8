"""PEFT's view of a LoRA run's exports: loads the base model directory with transformers, the adapter that
`shardtrain checkpoint export --peft` wrote over it with PeftModel.from_pretrained (failing unless every tensor of the
adapter file is one PEFT's model has, with that value, and PEFT's model has no adapter tensor the file lacks), and
the merged directory `checkpoint export --hf` wrote; scores the held-out texts with the PEFT model as the trainer's
causal_lm evaluation does (loss per predicted token over all of them, each text cut to MAX_LENGTH tokens), and
compares PEFT's own merge (merge_and_unload) with the merged directory's weights and the two models' logits.

usage: lora_check.py BASE_DIR ADAPTER_DIR MERGED_DIR EVAL_JSONL FIELD MAX_LENGTH
prints a JSON line: eval_loss, perplexity, base_eval_loss (the base model's), texts, tokens, adapter_tensors,
merged_weight_diff (max |PEFT's merge - the merged directory's| over every weight), merged_logit_diff.
"""
import json
import math
import os
import sys

import torch
import transformers
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def score(model, batches):
    loss, tokens = 0.0, 0
    with torch.no_grad():
        for ids in batches:
            n = ids.numel() - 1  # predicted tokens
            loss += model(input_ids=ids, labels=ids).loss.item() * n
            tokens += n
    return loss / tokens, tokens


def main(base_dir, adapter_dir, merged_dir, eval_jsonl, field, max_length):
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    with open(eval_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)[field] for line in f]
    batches = [tokenizer(t, truncation=True, max_length=max_length, return_tensors="pt").input_ids for t in texts]

    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    base_loss, _ = score(base, batches)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    theirs = get_peft_model_state_dict(model)
    if set(saved) != set(theirs):
        raise SystemExit(f"adapter names differ: only in the file {sorted(set(saved) - set(theirs))[:5]}, "
                         f"only in PEFT's model {sorted(set(theirs) - set(saved))[:5]}")
    for name, t in saved.items():
        if not torch.equal(t, theirs[name]):
            raise SystemExit(f"{name}: PEFT's model holds other values than the file")
    eval_loss, tokens = score(model, batches)

    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    logit_diff = 0.0
    with torch.no_grad():
        for ids in batches[:8]:
            logit_diff = max(logit_diff, (model(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max().item())
    peft_merged = model.merge_and_unload().state_dict()
    ours = merged.state_dict()
    weight_diff = max((peft_merged[k] - ours[k]).abs().max().item() for k in ours)
    print(json.dumps({"eval_loss": eval_loss, "perplexity": math.exp(eval_loss), "base_eval_loss": base_loss,
                      "texts": len(texts), "tokens": tokens, "adapter_tensors": len(saved),
                      "merged_weight_diff": weight_diff, "merged_logit_diff": logit_diff}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
