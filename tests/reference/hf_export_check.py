"""transformers' view of a `shardtrain checkpoint export --hf` directory: loads it with from_pretrained (the class its
config.json names), fails on any weight the model expected and the directory lacks, loads the tokenizer when there
is one, and records a batch and the model's outputs on it (eval mode, float32) for tests/train/train_test.cpp to
compare with shardtrain's model loaded from the same directory.

With GENERATED_JSONL (`shardtrain generate --json`'s records for the directory), each prompt is also continued by
transformers' generate (greedy, as many new tokens as shardtrain made; GENERATE_JSON's keyword arguments instead,
e.g. {"num_beams": 3, "max_new_tokens": 6}): the same tokens, or the check fails.

usage: hf_export_check.py EXPORT_DIR OUT.safetensors [GENERATED_JSONL [GENERATE_JSON]]
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

# Weights a class reads from the files but shardtrain's model of it has no use for: none may be missing; these may
# be left over. BertForMaskedLM has no pooler (the export keeps it for sequence classification), BertModel no head
# (neither the masked-LM head nor the classifier).
UNUSED_OK = {"BertForMaskedLM": ("bert.pooler.",), "BertModel": ("cls.", "classifier.")}


def load(cls_name, path):
    cls = getattr(transformers, cls_name)
    model, info = cls.from_pretrained(path, output_loading_info=True)
    missing = [k for k in info["missing_keys"]]
    unexpected = [k for k in info["unexpected_keys"] if not k.startswith(UNUSED_OK.get(cls_name, ("\0",)))]
    if missing or unexpected or info.get("mismatched_keys"):
        raise SystemExit(f"{cls_name} from {path}: missing {missing}, unexpected {unexpected}, "
                         f"mismatched {info.get('mismatched_keys')}")
    return model.eval().float()


def text_batch(g, vocab, batch=3, length=12):
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 8:] = 0  # a padded sample
    return ids, mask


def check_generated(path, model, tokenizer, generated_jsonl, options):
    with open(generated_jsonl, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    first = 1 if model.config.is_encoder_decoder else None  # after the decoder's start token, or the prompt's
    for r in records:
        ids = tokenizer(r["prompt"], return_tensors="pt")["input_ids"]
        kwargs = dict(do_sample=False, max_new_tokens=len(r["tokens"]), pad_token_id=0)
        kwargs.update(options)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        theirs = out[0, first or ids.shape[1]:].tolist()[:len(r["tokens"])]
        if theirs != r["tokens"]:
            raise SystemExit(f"{path}: {r['prompt']!r}: shardtrain generated {r['tokens']}, transformers {theirs}")
    print(f"generation: {len(records)} prompts continued as transformers' generate")


def main():
    path, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    arch, family = config["architectures"][0], config["model_type"]
    g = torch.Generator().manual_seed(7)
    io = {}
    with torch.no_grad():
        if family == "bert":
            model = load(arch, path)
            ids, mask = text_batch(g, config["vocab_size"])
            types = torch.zeros_like(ids)
            types[:, 6:] = 1
            base = load("BertModel", path)(input_ids=ids, attention_mask=mask, token_type_ids=types)
            io = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, hidden=base.last_hidden_state,
                      pooled=base.pooler_output, logits=model(input_ids=ids, attention_mask=mask,
                                                              token_type_ids=types).logits)
        elif family == "vit":
            model = load(arch, path)
            c = config
            pixels = torch.randn(3, c["num_channels"], c["image_size"], c["image_size"], generator=g)
            io = dict(pixels=pixels, logits=model(pixel_values=pixels).logits,
                      hidden=model.vit(pixel_values=pixels).last_hidden_state)
        elif family == "t5":
            model = load(arch, path)
            ids, mask = text_batch(g, config["vocab_size"], length=20)
            labels = torch.randint(0, config["vocab_size"], (3, 9), generator=g)
            labels[2, 6:] = -100
            o = model(input_ids=ids, attention_mask=mask, labels=labels)
            io = dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss,
                      encoder_hidden=o.encoder_last_hidden_state)
        elif family in ("llama", "mistral", "qwen2", "qwen3", "gpt2") and arch.endswith("ForSequenceClassification"):
            # A causal LM's classifier scores each row's last token that is not pad_token_id: the padding is that.
            model = load(arch, path)
            ids, mask = text_batch(g, config["vocab_size"])
            ids = ids.masked_fill(mask == 0, config["pad_token_id"])
            labels = torch.randint(0, len(config["id2label"]), (ids.shape[0],), generator=g)
            o = model(input_ids=ids, attention_mask=mask, labels=labels)
            io = dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss)
        elif family in ("llama", "mistral", "qwen2", "qwen3", "gpt2"):  # causal LMs
            model = load(arch, path)
            ids, mask = text_batch(g, config["vocab_size"])
            labels = ids.masked_fill(mask == 0, -100)
            o = model(input_ids=ids, attention_mask=mask, labels=labels)
            io = dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss)
        elif family == "flava":
            model = load(arch, path)
            text, image = config["text_config"], config["image_config"]
            size, patch = image["image_size"], image["patch_size"]
            ids, mask = text_batch(g, text["vocab_size"], batch=4)
            masked_ids = ids.clone()
            mlm_labels = torch.full_like(ids, -100)
            for i, j in [(0, 2), (1, 4), (2, 1), (3, 5)]:
                mlm_labels[i, j] = ids[i, j]
                masked_ids[i, j] = 4
            pixels = torch.randn(4, 3, size, size, generator=g)
            codebook_size = size // patch * 8  # the codebook sees 8x8 pixels per patch
            codebook_pixels = torch.rand(4, 3, codebook_size, codebook_size, generator=g)
            masked_patches = torch.rand(4, (size // patch) ** 2, generator=g) < 0.4
            masked_patches[:, 0] = True
            itm_labels = torch.tensor([1, 0, 1, 1])
            o = model(input_ids=ids, input_ids_masked=masked_ids, attention_mask=mask, pixel_values=pixels,
                      codebook_pixel_values=codebook_pixels, bool_masked_pos=masked_patches, mlm_labels=mlm_labels,
                      itm_labels=itm_labels, return_loss=True)
            io = dict(input_ids=ids, input_ids_masked=masked_ids, attention_mask=mask, pixels=pixels,
                      codebook_pixels=codebook_pixels, masked_patches=masked_patches, mlm_labels=mlm_labels,
                      itm_labels=itm_labels, loss=o.loss, itm_logits=o.itm_logits,
                      logits_per_image=o.contrastive_logits_per_image)
        else:
            raise SystemExit(f"{path}: model_type {family!r} is not one this check knows")
    tokenizer_files = [f for f in ("tokenizer.json", "vocab.txt", "spiece.model", "tokenizer.model")
                       if os.path.exists(os.path.join(path, f))]
    if tokenizer_files:
        # The class tokenizer_config.json names; AutoTokenizer would take transformers' own choice for some model
        # types (Mistral's needs a tokenizer.json, which a WordPiece vocab.txt export does not have).
        named = None
        if os.path.exists(os.path.join(path, "tokenizer_config.json")):
            with open(os.path.join(path, "tokenizer_config.json")) as f:
                named = json.load(f).get("tokenizer_class")
        tok = (getattr(transformers, named) if named else transformers.AutoTokenizer).from_pretrained(path)
        encoded = tok("a red square beside a blue circle")["input_ids"]
        io["tokenized"] = torch.tensor(encoded)
        print(f"hf_export_check: tokenizer {type(tok).__name__}, {len(tok)} tokens")
    save_file({k: v.contiguous() for k, v in io.items()}, out)
    print(f"hf_export_check: {arch} from {path}: every weight loaded; wrote {out}")
    if len(sys.argv) > 3:
        check_generated(path, model, tok, sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})


if __name__ == "__main__":
    main()
