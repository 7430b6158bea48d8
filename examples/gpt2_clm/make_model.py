"""A small GPT-2 as a user downloads one: GPT2LMHeadModel with random weights written by transformers'
save_pretrained, and beside it a GPT-2-style tokenizer.json (byte-level BPE behind GPT-2's own split pattern,
<|endoftext|> its one special token, nothing added to a text) trained by Hugging Face's tokenizers on the example's
texts, at a size this machine trains in a minute.

usage: make_model.py OUT_DIR TRAIN_JSONL
"""
import json
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel

transformers.logging.disable_progress_bar()
transformers.logging.set_verbosity_error()


def tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's pattern, then bytes
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def main(out, train_jsonl):
    torch.manual_seed(0)
    with open(train_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["input"] for line in f]
    tok = tokenizer(texts)
    end = tok.token_to_id("<|endoftext|>")
    config = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=end, eos_token_id=end)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(out)
    tok.save(f"{out}/tokenizer.json")
    with open(f"{out}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 64}, f, indent=1)
    print(f"make_model: GPT2LMHeadModel ({sum(p.numel() for p in model.parameters()):,} parameters) and a "
          f"byte-level BPE tokenizer.json ({tok.get_vocab_size()} tokens) in {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
