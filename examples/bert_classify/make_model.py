"""A small BERT as transformers writes one: BertForMaskedLM with random weights, saved with save_pretrained, and the
WordPiece vocabulary beside it, so that the directory is what a user downloads from the Hub, at a size this machine
trains in seconds.

usage: make_model.py OUT_DIR VOCAB_TXT
"""
import shutil
import sys

import torch
import transformers
from transformers import BertConfig, BertForMaskedLM

transformers.logging.disable_progress_bar()


def main(out, vocab):
    torch.manual_seed(0)
    with open(vocab, encoding="utf-8") as f:
        size = sum(1 for _ in f)
    config = BertConfig(vocab_size=size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(out)
    shutil.copy(vocab, f"{out}/vocab.txt")
    print(f"make_model: BertForMaskedLM ({sum(p.numel() for p in BertForMaskedLM(config).parameters()):,} "
          f"parameters, vocabulary {size}) in {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
