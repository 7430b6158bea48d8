"""`shardtrain generate` against transformers' generate() on the same model directory, in one run: per family a
model of a few tens of millions of parameters (transformers builds it with random weights and saves it, with a
WordPiece vocab.txt of as many tokens as the model's vocabulary), 16 prompts of 8 to 40 words, greedy decoding of
up to 64 new tokens, batches of 8 left-padded prompts, float32 on the CPU, both with a KV cache. Prints the tokens
per second of each (the generation loop alone: shardtrain's own count on stderr, transformers' timed around its
generate calls; loading excluded), their ratio (ours over theirs: above 1 is faster), and how many prompts got the
same tokens from both. --num-beams K: beam search over K hypotheses a prompt instead of greedy decoding (tokens per
second then count each prompt's best hypothesis; the decoder runs K times the rows).

    .venv/bin/python bench/generate_vs_hf.py [--build build] [--families gpt2,llama,t5] [--new-tokens 64]
                                             [--num-beams K]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from transformers import (BertTokenizerFast, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, T5Config,
                          T5ForConditionalGeneration)

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

VOCAB = 8000
BATCH = 8
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def models():
    """Per family: transformers' model at a few tens of millions of parameters, random weights."""
    return {
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=768, n_layer=6, n_head=12,
                                                   eos_token_id=VOCAB + 1, bos_token_id=VOCAB + 1)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=768, intermediate_size=2048,
                                                      num_hidden_layers=6, num_attention_heads=12,
                                                      num_key_value_heads=4, max_position_embeddings=512,
                                                      eos_token_id=VOCAB + 1, bos_token_id=None, pad_token_id=0)),
        "t5": lambda: T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048,
                                                          num_layers=6, num_heads=8, eos_token_id=VOCAB + 1,
                                                          pad_token_id=0, decoder_start_token_id=0)),
    }


def write_model(family, make, directory):
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():  # larger weights than the initialisation's: peaked scores, no near-ties for greedy
        for p in model.parameters():
            p.mul_(3.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(directory, safe_serialization=True)
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(SPECIAL + words) + "\n")
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": True}, f)
    return model, words


def ours(build, directory, prompts_file, new_tokens, num_beams):
    cmd = [os.path.join(build, "shardtrain"), "generate", directory, "--prompts", prompts_file, "--greedy",
           "--max-new-tokens", str(new_tokens), "--batch-size", str(BATCH), "--num-beams", str(num_beams), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    line = [l for l in out.stderr.splitlines() if "tokens/s" in l][-1]  # "generate: N tokens for P prompt(s) in X s"
    made, seconds = int(line.split()[1]), float(line.split(" in ")[1].split()[0])
    return [json.loads(l)["tokens"] for l in out.stdout.splitlines()], made, seconds


def theirs(model, directory, prompts, new_tokens, encoder_decoder, num_beams):
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    tokenizer.padding_side = "left"
    results, made, seconds = [], 0, 0.0
    for first in range(0, len(prompts), BATCH):
        batch = tokenizer(prompts[first:first + BATCH], return_tensors="pt", padding=True, return_token_type_ids=False)
        began = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**batch, do_sample=False, max_new_tokens=new_tokens, pad_token_id=0,
                                 num_beams=num_beams)
        seconds += time.perf_counter() - began
        for row in out[:, 1 if encoder_decoder else batch["input_ids"].shape[1]:].tolist():
            results.append(row)
            made += len(row)
    return results, made, seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--families", default="gpt2,llama,t5")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--num-beams", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(1)
    print(f"{'family':8} {'params':>8} {'ours tok/s':>11} {'transformers tok/s':>19} {'ratio':>6}  same tokens")
    for family in args.families.split(","):
        with tempfile.TemporaryDirectory() as d:
            model, words = write_model(family, models()[family], d)
            prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(16)]
            prompts_file = os.path.join(d, "prompts.txt")
            with open(prompts_file, "w") as f:
                f.write("\n".join(prompts) + "\n")
            our_tokens, our_made, our_s = ours(args.build, d, prompts_file, args.new_tokens, args.num_beams)
            their_tokens, _, their_s = theirs(model, d, prompts, args.new_tokens, family == "t5", args.num_beams)
            # Theirs are padded to the batch's longest row: compare each of ours with as many of theirs.
            same = sum(o == t[:len(o)] for o, t in zip(our_tokens, their_tokens))
            params = sum(p.numel() for p in model.parameters()) / 1e6
            our_rate, their_rate = our_made / our_s, our_made / their_s  # the same tokens made on both sides
            print(f"{family:8} {params:7.1f}M {our_rate:11.1f} {their_rate:19.1f} {our_rate / their_rate:5.2f}x  "
                  f"{same} of {len(prompts)}")


if __name__ == "__main__":
    main()
