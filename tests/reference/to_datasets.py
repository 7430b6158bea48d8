"""The synthetic data of `shardtrain data synth` as Hugging Face datasets, in the shapes the Hub's datasets have, saved
with save_to_disk: what a user of datasets gives `shardtrain train` (tests/train/train_test.cpp trains on both and
compares).

Usage: to_datasets.py PAIRS_DIR IMAGE_DIR OUT VOCAB
  OUT/mrpc    DatasetDict {train, validation} of PAIRS_DIR's train.tsv and eval.tsv with GLUE MRPC's features:
              sentence1, sentence2, label (ClassLabel not_equivalent/equivalent), idx; rows in the files' order
  OUT/hub     the same pairs as a Hub dataset repository holds them: data/{train,validation}-00000-of-00001.parquet
  OUT/mrpc_tokenized  OUT/mrpc tokenized as transformers' run_glue does it (dataset.map of BertTokenizerFast over
              VOCAB, lower-cased, pairs truncated to 32 tokens): input_ids, token_type_ids, attention_mask added
  OUT/tokenized_hub  the same padded to 32 (padding="max_length"), as Parquet files of each split
  OUT/foreign token ids from a larger vocabulary than VOCAB's (a dataset tokenized by another tokenizer)
  OUT/seq2seq.jsonl  the train pairs as seq2seq records {input: sentence1, target: sentence2}
  OUT/seq2seq_tokenized  the same as run_summarization tokenizes them: tok(input, text_target=target) padded to 32,
              the labels' padding -100
  OUT/stsb    a regression as GLUE STS-B holds one: DatasetDict {train, validation} of the pairs with a float32
              similarity score as label (4.x for equivalent pairs, 1.x for the others); OUT/stsb_tsv/{train,
              validation}.tsv the same as STS-B's .tsv files (sentence1, sentence2, score)
  OUT/multilabel  multi-label classification as go_emotions holds one: DatasetDict {train, validation} of the
              pairs' second texts with labels, a List(ClassLabel) of the shapes each names (circle, square,
              triangle, diamond, cross; one or two); OUT/multilabel_{train,validation}.jsonl the same as .jsonl
              records {"text": ..., "labels": [names]}, OUT/multilabel_{train,validation}.tsv as go_emotions' own
              .tsv files (text, then the ids separated by commas)
  OUT/ner     token classification as CoNLL-2003 holds it: DatasetDict {train, validation} of the pairs' second
              texts split at spaces (tokens: List(Value(string))) with IOB tags (ner_tags: List(ClassLabel O, B-OBJ,
              I-OBJ, B-LOC, I-LOC)): an object is its size, colour and shape words, a location its position word;
              words of several sub-word tokens: every third text ends in "tagged" (O), every other "top" is
              "topmost" (B-LOC); OUT/ner_{train,
              validation}.jsonl the same as .jsonl records {"tokens": [...], "ner_tags": [names]}, OUT/ner_hub the
              same as the Hub's Parquet files of each split, OUT/ner_{train,validation}.conll in CoNLL-2003's
              columns (word, part of speech, chunk, tag)
  OUT/shapes  DatasetDict {train} of IMAGE_DIR's WebDataset tars as an image-classification dataset (CIFAR-10's
              shape): img (Image, the tars' PNG bytes unchanged), label (ClassLabel); samples in the tars' order
"""
import json
import os
import sys
import tarfile

import datasets
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Sequence, Value

datasets.disable_progress_bars()


def pairs(path):
    rows = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    with open(path) as f:
        next(f)  # Quality, #1 ID, #2 ID, #1 String, #2 String
        for i, line in enumerate(f):
            quality, _, _, s1, s2 = line.rstrip("\n").split("\t")
            rows["sentence1"].append(s1)
            rows["sentence2"].append(s2)
            rows["label"].append(int(quality))
            rows["idx"].append(i)
    features = Features({"sentence1": Value("string"), "sentence2": Value("string"),
                         "label": ClassLabel(names=["not_equivalent", "equivalent"]), "idx": Value("int32")})
    return Dataset.from_dict(rows, features=features)


def shapes(image_dir):
    images, labels = [], []
    for name in sorted(os.listdir(image_dir)):
        if not name.endswith(".tar"):
            continue
        with tarfile.open(os.path.join(image_dir, name)) as tar:
            members = {}
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = tar.extractfile(m).read()
            for key, parts in members.items():  # insertion order: the tar's
                images.append({"bytes": parts["png"], "path": None})
                labels.append(int(parts["cls"]))
    names = ["class%d" % i for i in range(10)]  # vit-debug classifies 10 classes
    return Dataset.from_dict({"img": images, "label": labels},
                             features=Features({"img": Image(), "label": ClassLabel(names=names)}))


def main(pairs_dir, image_dir, out, vocab):
    mrpc = DatasetDict({"train": pairs(os.path.join(pairs_dir, "train.tsv")),
                        "validation": pairs(os.path.join(pairs_dir, "eval.tsv"))})
    mrpc.save_to_disk(os.path.join(out, "mrpc"))
    os.makedirs(os.path.join(out, "hub", "data"))
    for split, d in mrpc.items():
        d.to_parquet(os.path.join(out, "hub", "data", split + "-00000-of-00001.parquet"))
    from transformers import BertTokenizerFast
    tok = BertTokenizerFast(vocab, do_lower_case=True)
    mrpc.map(lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=32),
             batched=True).save_to_disk(os.path.join(out, "mrpc_tokenized"))
    padded = mrpc.map(lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=32,
                                    padding="max_length"), batched=True)
    os.makedirs(os.path.join(out, "tokenized_hub"))
    for split, d in padded.items():
        d.to_parquet(os.path.join(out, "tokenized_hub", split + "-00000-of-00001.parquet"))
    foreign = Dataset.from_dict({"input_ids": [[2, 7, 30521, 3]] * 8, "label": [0, 1] * 4})
    foreign.save_to_disk(os.path.join(out, "foreign"))
    train = mrpc["train"]
    with open(os.path.join(out, "seq2seq.jsonl"), "w") as f:
        for a, b in zip(train["sentence1"], train["sentence2"]):
            f.write(json.dumps({"input": a, "target": b}) + "\n")

    def seq2seq(b):
        enc = tok(b["sentence1"], text_target=b["sentence2"], truncation=True, max_length=32, padding="max_length")
        enc["labels"] = [[t if t != tok.pad_token_id else -100 for t in row] for row in enc["labels"]]
        return enc
    train.map(seq2seq, batched=True).save_to_disk(os.path.join(out, "seq2seq_tokenized"))
    DatasetDict({"train": shapes(image_dir)}).save_to_disk(os.path.join(out, "shapes"))

    # A regression as GLUE's STS-B: a similarity score per pair (float32), here 4 for the equivalent pairs and 1 for
    # the others, set apart by tenths; as save_to_disk splits and as STS-B's own .tsv files (the score as text).
    os.makedirs(os.path.join(out, "stsb_tsv"))
    stsb = {}
    for split, d in mrpc.items():
        scores = [(4.0 if q else 1.0) + (i % 5) / 10 for i, q in enumerate(d["label"])]
        stsb[split] = Dataset.from_dict({"sentence1": d["sentence1"], "sentence2": d["sentence2"], "label": scores},
                                        features=Features({"sentence1": Value("string"), "sentence2": Value("string"),
                                                           "label": Value("float32")}))
        with open(os.path.join(out, "stsb_tsv", split + ".tsv"), "w") as f:
            f.write("sentence1\tsentence2\tscore\n")
            for a, b, x in zip(d["sentence1"], d["sentence2"], stsb[split]["label"]):
                f.write("%s\t%s\t%r\n" % (a, b, x))
    DatasetDict(stsb).save_to_disk(os.path.join(out, "stsb"))

    # Multi-label (go_emotions' layout): each text's set of the shapes it names, as a List(ClassLabel) of ids and as
    # .jsonl arrays of the names.
    shape_names = ["circle", "square", "triangle", "diamond", "cross"]
    multilabel = {}
    for split, d in mrpc.items():
        texts = list(d["sentence2"])
        labels = [[i for i, name in enumerate(shape_names) if name in t] for t in texts]
        multilabel[split] = Dataset.from_dict(
            {"text": texts, "labels": labels},
            features=Features({"text": Value("string"), "labels": Sequence(ClassLabel(names=shape_names))}))
        with open(os.path.join(out, "multilabel_" + split + ".jsonl"), "w") as f:
            for t, ids in zip(texts, labels):
                f.write(json.dumps({"text": t, "labels": [shape_names[i] for i in ids]}) + "\n")
        with open(os.path.join(out, "multilabel_" + split + ".tsv"), "w") as f:
            f.write("text\tlabels\n")
            for t, ids in zip(texts, labels):
                f.write("%s\t%s\n" % (t, ",".join(str(i) for i in ids)))
    DatasetDict(multilabel).save_to_disk(os.path.join(out, "multilabel"))

    # Token classification (CoNLL-2003's layout): objects (size, colour, shape words) and locations, IOB tags.
    ner_names = ["O", "B-OBJ", "I-OBJ", "B-LOC", "I-LOC"]
    sizes, places = {"small", "large"}, {"top", "bottom", "middle", "left", "right"}
    colours = {"red", "green", "blue", "white", "purple", "yellow", "black", "orange"}

    def tags_of(words):
        tags = []
        for w in words:
            inside = bool(tags) and tags[-1] in ("B-OBJ", "I-OBJ")
            if w in sizes or w in colours or any(w.startswith(s) for s in shape_names):
                tags.append("I-OBJ" if inside and w not in sizes else "B-OBJ")
            elif w in places or w == "topmost":
                tags.append("B-LOC")
            else:
                tags.append("O")
        return tags
    ner = {}
    for split, d in mrpc.items():
        words = [[("topmost" if w == "top" and i % 2 == 0 else w) for w in t.split()] + (["tagged"] if i % 3 == 0
                                                                                         else [])
                 for i, t in enumerate(d["sentence2"])]
        tags = [tags_of(w) for w in words]
        ner[split] = Dataset.from_dict(
            {"tokens": words, "ner_tags": [[ner_names.index(t) for t in row] for row in tags]},
            features=Features({"tokens": Sequence(Value("string")), "ner_tags": Sequence(ClassLabel(names=ner_names))}))
        with open(os.path.join(out, "ner_" + split + ".jsonl"), "w") as f:
            for w, t in zip(words, tags):
                f.write(json.dumps({"tokens": w, "ner_tags": t}) + "\n")
        with open(os.path.join(out, "ner_" + split + ".conll"), "w") as f:  # CoNLL-2003's columns
            f.write("-DOCSTART- -X- -X- O\n\n")
            for w, t in zip(words, tags):
                f.write("".join("%s NN O %s\n" % (word, tag) for word, tag in zip(w, t)) + "\n")
    DatasetDict(ner).save_to_disk(os.path.join(out, "ner"))
    os.makedirs(os.path.join(out, "ner_hub"))
    for split, d in ner.items():
        d.to_parquet(os.path.join(out, "ner_hub", split + "-00000-of-00001.parquet"))


if __name__ == "__main__":
    main(*sys.argv[1:5])
