"""What transformers' backward adds above the end of its forward, for each family's loss, at shapes where the
vocabulary dominates: the fixture of tests/models/loss_memory_test.cpp, which measures shardtrain's model on the same
weights and batch with the same counter and holds it to no more.

For each case: a model built by transformers with seeded random weights and dropout off, saved as a model
directory (config.json, model.safetensors), a batch under data::Batch's names (batch.safetensors), and, counted by
shardtrain's allocator (libshardtrain_memhook.so, installed here), what forward with the loss keeps when it has
returned (`model(...).loss`, the outputs dropped: the bytes live then above those live before it) and the most
live during `loss.backward()` above the end of forward — on the second of two steps, gradients set to None before
each, so that both sides start from the same state.

usage: loss_memory_reference.py OUT_DIR MEMHOOK
writes OUT_DIR/<case>/{config.json, model.safetensors, batch.safetensors} and OUT_DIR/backward.json:
{case: {"kept_bytes", "above_bytes"}}, with "<case>-checkpointed" entries for the CHECKPOINTED cases
"""
import ctypes
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers

transformers.logging.set_verbosity_error()

ROWS, TOKENS = 4, 64
# Cases measured again with every layer checkpointed (transformers' non-reentrant gradient checkpointing), as
# "<case>-checkpointed": what a checkpointed layer keeps (its inputs, the attention's bias among them) is kept
# through the whole backward.
CHECKPOINTED = ("llama", "gpt2", "bert", "t5")


def cases():
    """(name, transformers model, batch under data::Batch's names, the model's loss on the batch)."""
    g = torch.Generator().manual_seed(3)
    out = []

    def ids(vocab, rows=ROWS, tokens=TOKENS):
        return torch.randint(5, vocab, (rows, tokens), generator=g)

    # A 32k vocabulary on 64-wide layers: the (B, T, V) logits outweigh everything else the step holds.
    llama = transformers.LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                     tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    x = ids(llama.vocab_size)
    mask = torch.ones_like(x)
    out.append(("llama", transformers.LlamaForCausalLM(llama), dict(input_ids=x, attention_mask=mask, labels=x),
                lambda m, b: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss))

    gpt2 = transformers.GPT2Config(vocab_size=32000, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, architectures=["GPT2LMHeadModel"])
    x = ids(gpt2.vocab_size)
    out.append(("gpt2", transformers.GPT2LMHeadModel(gpt2), dict(input_ids=x, attention_mask=torch.ones_like(x),
                                                                labels=x),
                lambda m, b: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss))

    bert = transformers.BertConfig(vocab_size=32000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0, architectures=["BertForMaskedLM"])
    x = ids(bert.vocab_size)
    labels = torch.full_like(x, -100)
    chosen = torch.rand(x.shape, generator=g) < 0.15
    labels[chosen] = x[chosen]
    masked = x.masked_fill(chosen, 103)
    out.append(("bert", transformers.BertForMaskedLM(bert),
                dict(input_ids_masked=masked, attention_mask=torch.ones_like(x), mlm_labels=labels),
                lambda m, b: m(input_ids=b["input_ids_masked"], attention_mask=b["attention_mask"],
                               labels=b["mlm_labels"]).loss))

    t5 = transformers.T5Config(vocab_size=32000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                               dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                               architectures=["T5ForConditionalGeneration"])
    x = ids(t5.vocab_size)
    out.append(("t5", transformers.T5ForConditionalGeneration(t5),
                dict(input_ids=x, attention_mask=torch.ones_like(x), labels=ids(t5.vocab_size, tokens=TOKENS // 2)),
                lambda m, b: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss))

    # A classifier: the LM's layers, one row a sample through the score (3 classes; the vocabulary only embeds).
    classifier = transformers.LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                          num_labels=3, pad_token_id=0, architectures=["LlamaForSequenceClassification"])
    x = ids(classifier.vocab_size)
    out.append(("llama-classifier", transformers.LlamaForSequenceClassification(classifier),
                dict(input_ids=x, attention_mask=torch.ones_like(x), labels=torch.tensor([0, 1, 2, 1])),
                lambda m, b: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss))
    return out


def main():
    out_dir, memhook = sys.argv[1], sys.argv[2]
    hook = ctypes.CDLL(memhook)
    for f in ("shardtrain_cpu_current_bytes", "shardtrain_cpu_peak_bytes"):
        getattr(hook, f).restype = ctypes.c_int64
    hook.shardtrain_install_cpu_memory_counter()
    results = {}
    torch.manual_seed(1)
    for name, model, batch, loss_of in cases():
        d = os.path.join(out_dir, name)
        model.save_pretrained(d, safe_serialization=True)
        save_file({k: v.clone() for k, v in batch.items()}, os.path.join(d, "batch.safetensors"))
        # Allocated copies of the weights, counted as shardtrain's loading allocates them (see hf_family_step.py).
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                t.data = t.data.clone()
        model.train()
        for checkpointed in (False, True) if name in CHECKPOINTED else (False,):
            if checkpointed:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                start = hook.shardtrain_cpu_current_bytes()
                loss = loss_of(model, batch)
                end = hook.shardtrain_cpu_current_bytes()
                hook.shardtrain_reset_cpu_peak()
                loss.backward()
                peak = hook.shardtrain_cpu_peak_bytes()
                del loss
            case = name + ("-checkpointed" if checkpointed else "")
            results[case] = {"kept_bytes": end - start, "above_bytes": peak - end}
            print(f"{case}: forward keeps {(end - start) / 1e6:.2f} MB, backward adds {(peak - end) / 1e6:.2f} MB "
                  "above")
    with open(os.path.join(out_dir, "backward.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
