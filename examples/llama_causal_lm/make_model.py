"""A small Llama as a user downloads one: LlamaForCausalLM with random weights written by transformers'
save_pretrained, and beside it a Llama 3-style tokenizer.json (byte-level BPE behind Llama 3's split pattern,
<|begin_of_text|> opening every text) trained by Hugging Face's tokenizers on the example's texts, at a size this
machine trains in a minute.

usage: make_model.py OUT_DIR TRAIN_JSONL
"""
import json
import sys

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM

transformers.logging.disable_progress_bar()

# Llama 3's pre-tokenization pattern (its tokenizer.json's Split pre-tokenizer)
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer(texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.decoder = decoders.ByteLevel()
    return tok


def main(out, train_jsonl):
    torch.manual_seed(0)
    with open(train_jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["input"] for line in f]
    tok = tokenizer(texts)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tok.token_to_id("<|begin_of_text|>"),
                         eos_token_id=tok.token_to_id("<|end_of_text|>"), tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save(f"{out}/tokenizer.json")
    with open(f"{out}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                   "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>", "model_max_length": 64}, f, indent=1)
    print(f"make_model: LlamaForCausalLM ({sum(p.numel() for p in model.parameters()):,} parameters) and a byte-level "
          f"BPE tokenizer.json ({tok.get_vocab_size()} tokens) in {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
