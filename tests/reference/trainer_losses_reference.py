"""transformers' side of the trainer's losses on a fixed batch (tests/train/trainer_losses_test.cpp): a small
model of FAMILY with random weights and dropout off, saved as a model directory (OUT/model); one batch of token
ids as a .jsonl the trainer reads (OUT/batch.jsonl: datasets' tokenized layout); and the losses of STEPS
training steps on that batch — the model's own loss, clip_grad_norm_ at 1.0, torch.optim.AdamW at a constant
learning rate of 1e-3 with weight decay 0.1 on every tensor of two or more dimensions and none on the rest — into
OUT/expected.json, before each step's update as the trainer logs them.

  llama  LlamaForCausalLM (grouped-query attention: 4 heads, 2 kv heads): 8 rows of 24 ids, labels the ids
  bert   BertForSequenceClassification, 3 classes named a, b, c: 8 rows of 10-24 ids right-padded with their
         attention mask, a class each
  t5     T5ForConditionalGeneration: 8 rows of 12-20 input ids (padded, masked) and 8 targets of 6 ids ending in
         EOS (labels; the decoder reads them shifted right from the pad id)

Every row of a batch weighs the same in its loss (the causal LM's and T5's rows carry the same number of targets),
so the mean over the trainer's two ranks' halves is the mean over the batch.

usage: trainer_losses_reference.py FAMILY OUT STEPS
"""
import json
import os
import sys

import torch
import transformers

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

ROWS = 8
VOCAB = 128


def build(family):
    """The model, and each row of the batch as the .jsonl holds it."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    def ids(n):  # none of the vocabulary's special tokens below (ids 0-4), which the trainer treats as such
        return torch.randint(5, VOCAB, (n,), generator=g).tolist()

    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=64, tie_word_embeddings=False,
                                          architectures=["LlamaForCausalLM"])
        rows = [{"input_ids": ids(24)} for _ in range(ROWS)]
        return transformers.LlamaForCausalLM(config), rows
    if family == "bert":
        config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0, num_labels=3,
                                         id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2},
                                         architectures=["BertForSequenceClassification"])
        rows = []
        for i in range(ROWS):
            n = 10 + 2 * i
            rows.append({"input_ids": [2] + ids(n - 2) + [3], "attention_mask": [1] * n, "label": "abc"[i % 3]})
        return transformers.BertForSequenceClassification(config), rows
    if family == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                       num_decoder_layers=2, num_heads=4, dropout_rate=0.0, pad_token_id=0,
                                       eos_token_id=1, decoder_start_token_id=0,
                                       architectures=["T5ForConditionalGeneration"])
        rows = [{"input_ids": ids(12 + i) + [1], "labels": ids(5) + [1]} for i in range(ROWS)]
        return transformers.T5ForConditionalGeneration(config), rows
    raise SystemExit(f"trainer_losses_reference.py: unknown family {family!r} (llama, bert, t5)")


def batch_of(family, rows):
    """The rows as one batch of tensors, right-padded with 0 (the pad id of all three) and masked."""
    width = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, :len(r["input_ids"])] = 1
    batch = dict(input_ids=input_ids, attention_mask=mask)
    if family == "llama":
        batch["labels"] = input_ids.clone()
    elif family == "bert":
        batch["labels"] = torch.tensor(["abc".index(r["label"]) for r in rows])
    else:
        batch["labels"] = torch.tensor([r["labels"] for r in rows])
    return batch


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    family, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model, rows = build(family)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    # The trainer asks for a tokenizer beside token ids too (its pad id): a WordPiece vocabulary whose first ids are
    # BERT's special tokens, [PAD] = 0 as all three models pad.
    with open(os.path.join(out, "model", "vocab.txt"), "w", encoding="utf-8") as f:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        f.write("\n".join(specials + [f"t{i}" for i in range(len(specials), VOCAB)]) + "\n")
    with open(os.path.join(out, "batch.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

    model.train()
    batch = batch_of(family, rows)
    named = list(model.named_parameters())
    groups = [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"family": family, "losses": losses}, f)
    print(json.dumps({"family": family, "losses": losses}))


if __name__ == "__main__":
    main()
