"""Reading a dataset's rows: shardtrain's readers (build/data_bench) against Hugging Face datasets' own random access,
on the same files, each row once in a shuffled order (an epoch of the sampler), one thread each side.

Usage: .venv/bin/python bench/datasets_vs_hf.py [--build build] [--work /tmp/shardtrain_datasets_bench]
                                                [--text-rows 200000] [--images 2000]

Datasets written with datasets itself (the work directory is reused when its files exist):
  text    sentence pairs of 8-40 words with a ClassLabel (GLUE MRPC's features), as save_to_disk's .arrow and as
          Parquet from datasets' to_parquet (what a Hub repository holds)
  tokenized  the text pairs through dataset.map(BertTokenizerFast) as run_glue tokenizes (input_ids,
          token_type_ids, attention_mask beside the texts), the same two ways
  images  128x128 PNGs of noise and gradients with a ClassLabel (an Image column: CIFAR-style), the same two ways
  documents  texts of 50-3000 words (wikitext-like articles) for causal LM packing, and a byte-level BPE trained
          on them by tokenizers (GPT-2's kind, 4000 tokens)
Theirs: load_from_disk then ds[i] for the Arrow files (images with decode=False: bytes, as ours returns them); for
Parquet, Dataset.from_parquet — which converts the file into an Arrow cache first, timed as its "open" — then
ds[i]. Ours: data::SampleSource over the file, opened (indexed) then read row by row; a Parquet file both in
place and from its Arrow copy (data.cache_dir, what training reads; made while opening, in a fresh directory, as
theirs). Printed: seconds to open,
seconds to read every row, rows per second, and ours / theirs for the whole (open + read).

Packed for causal LM (data.packing against transformers' run_clm): theirs is run_clm's preprocessing —
dataset.map(tokenizer) then map(group_texts) into blocks of 1024 — then each block once in a shuffled order; ours
is data_bench --pack --cache: the texts' tokens counted into a cache file (data::PackedTexts), then each block read
once. Twice: a first start (datasets' cache files removed, our cache directory empty) and a later one, which reads
what the first kept (datasets' mapped Arrow files, our stream file). One thread each side.
"""
import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import datasets
import numpy as np
from datasets import ClassLabel, Dataset, Features, Image, Value
from PIL import Image as PILImage

datasets.disable_progress_bars()
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread each side: the tokenizers library's batches too
os.environ["RAYON_NUM_THREADS"] = "1"
WORDS = ("the a an of to in for on with at by from about as into like through after over between out against "
         "during without before under around among image picture photo shows small large red green blue circle "
         "square triangle cross top bottom middle left right three two one many few several some").split()


def make_text(work, rows):
    arrow, parquet = os.path.join(work, "text"), os.path.join(work, "text.parquet")
    if not os.path.exists(parquet):
        rng = random.Random(0)
        sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
        ds = Dataset.from_dict(
            {"sentence1": [sentence() for _ in range(rows)], "sentence2": [sentence() for _ in range(rows)],
             "label": [rng.randint(0, 1) for _ in range(rows)]},
            features=Features({"sentence1": Value("string"), "sentence2": Value("string"),
                               "label": ClassLabel(names=["not_equivalent", "equivalent"])}))
        shutil.rmtree(arrow, ignore_errors=True)
        ds.save_to_disk(arrow)
        ds.to_parquet(parquet)
    return arrow, parquet


def make_tokenized(work, text_arrow):
    arrow, parquet = os.path.join(work, "tokenized"), os.path.join(work, "tokenized.parquet")
    if not os.path.exists(parquet):
        from transformers import BertTokenizerFast
        vocab = os.path.join(work, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))) + "\n")
        tok = BertTokenizerFast(vocab)
        ds = datasets.load_from_disk(text_arrow).map(
            lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=128), batched=True)
        shutil.rmtree(arrow, ignore_errors=True)
        ds.save_to_disk(arrow)
        ds.to_parquet(parquet)
    return arrow, parquet


def make_images(work, count):
    arrow, parquet = os.path.join(work, "images"), os.path.join(work, "images.parquet")
    if not os.path.exists(parquet):
        rng = np.random.default_rng(0)
        encoded = []
        for i in range(count):
            ramp = np.linspace(0, 255, 128, dtype=np.float32)
            pixels = (ramp[None, :, None] * (i % 3) / 2 + rng.integers(0, 64, (128, 128, 3))).clip(0, 255)
            buf = io.BytesIO()
            PILImage.fromarray(pixels.astype(np.uint8)).save(buf, format="PNG")
            encoded.append({"bytes": buf.getvalue(), "path": None})
        ds = Dataset.from_dict({"img": encoded, "label": [i % 10 for i in range(count)]},
                               features=Features({"img": Image(), "label": ClassLabel(num_classes=10)}))
        shutil.rmtree(arrow, ignore_errors=True)
        ds.save_to_disk(arrow)
        ds.to_parquet(parquet)
    return arrow, parquet


def make_documents(work, count):
    arrow, tokenizer = os.path.join(work, "documents"), os.path.join(work, "bpe.json")
    if not os.path.exists(tokenizer):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
        rng = random.Random(2)
        docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 3000))) for _ in range(count)]
        shutil.rmtree(arrow, ignore_errors=True)
        Dataset.from_dict({"text": docs}).save_to_disk(arrow)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.train_from_iterator(docs[:200], trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|endoftext|>"],
                                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(tokenizer)
    return arrow, tokenizer


def packed(build, arrow, tokenizer, block_size):
    """Per start, first then later (caches kept): (ours: open, count, read s, blocks, tokens, counted),
    (theirs: map s, read s, blocks, tokens)."""
    from itertools import chain

    from transformers import PreTrainedTokenizerFast
    cache = tempfile.mkdtemp(prefix="packed_cache_")
    args = [os.path.join(build, "data_bench"), "--kind", "text", "--threads", "1", "--tokenizer", tokenizer,
            "--length", str(block_size), "--pack", "--cache", cache, arrow]
    fast = PreTrainedTokenizerFast(tokenizer_file=tokenizer)

    def group_texts(examples):  # run_clm's
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = len(concatenated["input_ids"]) // block_size * block_size
        return {k: [t[i: i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()}

    datasets.load_from_disk(arrow).cleanup_cache_files()  # a first start maps afresh, as ours counts afresh
    starts = []
    for _ in range(2):
        r = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout.split("RESULT ", 1)[1])
        t0 = time.perf_counter()
        tokenized = datasets.load_from_disk(arrow).map(lambda b: fast(b["text"]), batched=True,
                                                       remove_columns=["text"])
        blocks = tokenized.map(group_texts, batched=True)
        mapped = time.perf_counter()
        order = list(range(len(blocks)))
        random.Random(1).shuffle(order)
        for i in order:
            blocks[i]
        read = time.perf_counter() - mapped
        tokens = sum(len(x) for x in tokenized["input_ids"])
        starts.append(((r["open_s"], r["count_s"], r["read_s"], r["blocks"], r["tokens"], r["counted"]),
                       (mapped - t0, read, len(blocks), tokens)))
    shutil.rmtree(cache, ignore_errors=True)
    datasets.load_from_disk(arrow).cleanup_cache_files()
    return starts
def ours(build, path, kind, fields, copy):
    """Parquet read in place, or (copy) from its Arrow copy in a fresh cache directory: made while opening."""
    with tempfile.TemporaryDirectory() as cache:
        args = [os.path.join(build, "data_bench"), "--kind", kind, "--threads", "1"] + fields + [path]
        if copy:
            args[1:1] = ["--cache", cache]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    r = json.loads(out.split("RESULT ", 1)[1])
    return r["open_s"], r["read_s"], r["samples"]


def theirs(path, image_column, columns):
    t0 = time.perf_counter()
    if path.endswith(".parquet"):
        with tempfile.TemporaryDirectory() as cache:
            ds = Dataset.from_parquet(path, cache_dir=cache)
            return read_all(ds, image_column, columns, t0)
    return read_all(datasets.load_from_disk(path), image_column, columns, t0)


def read_all(ds, image_column, columns, t0):
    if image_column:
        ds = ds.cast_column(image_column, Image(decode=False))
    if columns:  # the columns the training reads, as ours
        ds = ds.select_columns(columns)
    opened = time.perf_counter()
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    for i in order:
        ds[i]
    return opened - t0, time.perf_counter() - opened, len(ds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--work", default="/tmp/shardtrain_datasets_bench")
    parser.add_argument("--text-rows", type=int, default=200000)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--documents", type=int, default=2000)
    a = parser.parse_args()
    os.makedirs(a.work, exist_ok=True)
    text_arrow, text_parquet = make_text(a.work, a.text_rows)
    tokens_arrow, tokens_parquet = make_tokenized(a.work, text_arrow)
    image_arrow, image_parquet = make_images(a.work, a.images)
    text_fields = ["--text", "sentence1,sentence2", "--label", "label"]
    image_fields = ["--label", "label"]
    tokens = ["input_ids", "token_type_ids", "attention_mask", "label"]
    cases = [("text, save_to_disk .arrow", text_arrow, "text", text_fields, None, None, False),
             ("text, Parquet in place", text_parquet, "text", text_fields, None, None, False),
             ("text, Parquet's Arrow copy", text_parquet, "text", text_fields, None, None, True),
             ("tokenized, save_to_disk .arrow", tokens_arrow, "text", ["--label", "label"], None, tokens, False),
             ("tokenized, Parquet in place", tokens_parquet, "text", ["--label", "label"], None, tokens, False),
             ("tokenized, Parquet's Arrow copy", tokens_parquet, "text", ["--label", "label"], None, tokens, True),
             ("images, save_to_disk .arrow", image_arrow, "image", image_fields, "img", None, False),
             ("images, Parquet in place", image_parquet, "image", image_fields, "img", None, False),
             ("images, Parquet's Arrow copy", image_parquet, "image", image_fields, "img", None, True)]
    print("%-32s %8s | %-24s | %-24s | %s" % ("data", "rows", "ours: open + read s", "datasets: open + read s",
                                               "ours/theirs"))
    for name, path, kind, fields, image_column, columns, copy in cases:
        o_open, o_read, rows = ours(a.build, path, kind, fields, copy)
        t_open, t_read, t_rows = theirs(path, image_column, columns)
        assert rows == t_rows, (rows, t_rows)
        print("%-32s %8d | %7.3f + %7.3f (%7.0f/s) | %7.3f + %7.3f (%7.0f/s) | %.3f" % (
            name, rows, o_open, o_read, rows / o_read, t_open, t_read, rows / t_read,
            (o_open + o_read) / (t_open + t_read)))
        sys.stdout.flush()
    doc_arrow, bpe = make_documents(a.work, a.documents)
    starts = packed(a.build, doc_arrow, bpe, 1024)
    print("\npacked for causal LM, %d documents, %d tokens, blocks of 1024 (run_clm drops each 1000 texts' rest)"
          % (a.documents, starts[0][0][4]))
    print("%-12s | %-34s | %-32s | %s" % ("start", "ours: open + count + read s (blocks)",
                                          "datasets: map + read s (blocks)", "ours/theirs"))
    for name, ((o_open, o_count, o_read, o_blocks, o_tokens, counted), (t_map, t_read, t_blocks, t_tokens)) in zip(
            ["first", "later"], starts):
        assert o_tokens == t_tokens, (o_tokens, t_tokens)
        assert counted == (name == "first"), (name, counted)
        print("%-12s | %6.3f + %6.3f + %6.3f (%7d) | %11.3f + %6.3f (%7d) | %.3f" % (
            name, o_open, o_count, o_read, o_blocks, t_map, t_read, t_blocks,
            (o_open + o_count + o_read) / (t_map + t_read)))

if __name__ == "__main__":
    main()
