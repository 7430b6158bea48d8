"""PEFT's view of a LoRA run's exports: loads the base model directory with transformers, the adapter that
`shardtrain checkpoint export --peft` wrote over it with PeftModel.from_pretrained (failing unless every tensor of the
adapter file is one PEFT's model has, with that value, and PEFT's model has no adapter tensor the file lacks), and
the merged directory `checkpoint export --hf` wrote; scores the held-out data with the PEFT model as the trainer's
evaluation does, and compares PEFT's own merge (merge_and_unload) with the merged directory's weights and the two
models' outputs.
  causal_lm: EVAL is a .jsonl of texts in FIELD; the loss per predicted token over all of them, each cut to
             MAX_LENGTH tokens (and its exp, the perplexity).
  classify:  EVAL is a .tsv of sentence pairs (FIELD: "first,second,label"; the label a class id); the mean
             cross-entropy per pair, each pair cut longest-first to MAX_LENGTH tokens, and the accuracy.

With `make_adapter`, PEFT writes an adapter of its own over the base model instead (a causal LM; rank 4 on TARGETS,
q_proj and v_proj by default, both matrices random: init_lora_weights=False) into ADAPTER_DIR and prints its
eval_loss and perplexity, for a run that starts from it (model.lora.from) to evaluate the same.

usage: lora_check.py causal_lm|classify BASE_DIR ADAPTER_DIR MERGED_DIR EVAL FIELD MAX_LENGTH
       lora_check.py make_adapter BASE_DIR ADAPTER_DIR EVAL FIELD MAX_LENGTH [TARGETS (default q_proj,v_proj)]
prints a JSON line: eval_loss, perplexity or accuracy, base_eval_loss (the base model's, causal_lm), samples,
adapter_tensors, merged_weight_diff (max |PEFT's merge - the merged directory's| over every weight),
merged_output_diff.
"""
import csv
import json
import math
import os
import sys

import torch
import transformers
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def causal_lm_data(tokenizer, path, field, max_length):
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)[field] for line in f]
    return [dict(input_ids=tokenizer(t, truncation=True, max_length=max_length, return_tensors="pt").input_ids)
            for t in texts]


def classify_data(tokenizer, path, field, max_length):
    first, second, label = field.split(",")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    out = []
    for start in range(0, len(rows), 32):
        batch = rows[start:start + 32]
        inputs = tokenizer([r[first] for r in batch], [r[second] for r in batch], padding=True, truncation=True,
                           max_length=max_length, return_tensors="pt")
        out.append(dict(inputs, labels=torch.tensor([int(r[label]) for r in batch])))
    return out


def score(task, model, batches):
    """(mean loss, the samples or predicted tokens it is over, accuracy or None)."""
    loss, count, correct = 0.0, 0, 0
    with torch.no_grad():
        for b in batches:
            if task == "causal_lm":
                n = b["input_ids"].numel() - 1  # predicted tokens
                loss += model(input_ids=b["input_ids"], labels=b["input_ids"]).loss.item() * n
            else:
                n = len(b["labels"])
                out = model(**b)
                loss += out.loss.item() * n
                correct += (out.logits.argmax(-1) == b["labels"]).sum().item()
            count += n
    return loss / count, count, (None if task == "causal_lm" else correct / count)


def outputs(task, model, b):
    inputs = {k: v for k, v in b.items() if k != "labels"}
    return model(**inputs).logits


def main(task, base_dir, adapter_dir, merged_dir, eval_path, field, max_length):
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    auto = AutoModelForCausalLM if task == "causal_lm" else AutoModelForSequenceClassification
    merged = auto.from_pretrained(merged_dir).eval()
    options = {} if task == "causal_lm" else dict(num_labels=merged.config.num_labels, id2label=merged.config.id2label,
                                                  label2id=merged.config.label2id)
    batches = (causal_lm_data if task == "causal_lm" else classify_data)(tokenizer, eval_path, field, max_length)

    base_loss, _, _ = score(task, auto.from_pretrained(base_dir, **options).eval(), batches)
    model = PeftModel.from_pretrained(auto.from_pretrained(base_dir, **options), adapter_dir).eval()
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    theirs = get_peft_model_state_dict(model)
    if set(saved) != set(theirs):
        raise SystemExit(f"adapter names differ: only in the file {sorted(set(saved) - set(theirs))[:5]}, "
                         f"only in PEFT's model {sorted(set(theirs) - set(saved))[:5]}")
    for name, t in saved.items():
        if not torch.equal(t, theirs[name]):
            raise SystemExit(f"{name}: PEFT's model holds other values than the file")
    eval_loss, count, accuracy = score(task, model, batches)
    # What PEFT's print_trainable_parameters counts: the adapters, and every parameter with them.
    lora_parameters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    all_parameters = sum(p.numel() for p in model.parameters())

    output_diff = 0.0
    with torch.no_grad():
        for b in batches[:8]:
            output_diff = max(output_diff, (outputs(task, model, b) - outputs(task, merged, b)).abs().max().item())
    peft_merged = model.merge_and_unload().state_dict()
    ours = merged.state_dict()
    weight_diff = max((peft_merged[k] - ours[k]).abs().max().item() for k in ours)
    result = {"eval_loss": eval_loss, "base_eval_loss": base_loss, "samples": count, "adapter_tensors": len(saved),
              "merged_weight_diff": weight_diff, "merged_output_diff": output_diff,
              "lora_parameters": lora_parameters, "all_parameters": all_parameters}
    if accuracy is None:
        result["perplexity"] = math.exp(eval_loss)
    else:
        result["accuracy"] = accuracy
    print(json.dumps(result))


def make_adapter(base_dir, adapter_dir, eval_path, field, max_length, targets="q_proj,v_proj"):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(5)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets.split(","),
                        init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), config).eval()
    model.save_pretrained(adapter_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    eval_loss, count, _ = score("causal_lm", model, causal_lm_data(tokenizer, eval_path, field, max_length))
    print(json.dumps({"eval_loss": eval_loss, "perplexity": math.exp(eval_loss), "samples": count}))


if __name__ == "__main__":
    if sys.argv[1] == "make_adapter":
        make_adapter(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), *sys.argv[7:8])
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], int(sys.argv[7]))
