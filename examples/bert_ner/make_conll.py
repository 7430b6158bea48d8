"""Named entities in the synthetic captions, written as CoNLL-2003's own files (one word per line: the word, a part of
speech, a chunk tag and the entity tag; blank lines between sentences; a -DOCSTART- line first): an object is the
words of its size, colour and shape ("small green crosses": B-OBJ I-OBJ I-OBJ), a location the word of its position
("top": B-LOC), every other word O.

usage: make_conll.py PAIRS_DIR OUT_DIR   (reads PAIRS_DIR/{train,eval}.tsv, writes OUT_DIR/{train,valid}.conll)
"""
import csv
import os
import sys

SIZES = {"small", "large"}
COLOURS = {"red", "green", "blue", "white", "purple", "yellow", "black", "orange", "cyan"}
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
PLACES = {"top", "bottom", "middle", "left", "right"}


def tags_of(words):
    tags = []
    for w in words:
        inside = bool(tags) and tags[-1] in ("B-OBJ", "I-OBJ")
        if w in SIZES or w in COLOURS or w.startswith(SHAPES):
            tags.append("I-OBJ" if inside and w not in SIZES else "B-OBJ")
        else:
            tags.append("B-LOC" if w in PLACES else "O")
    return tags


def main(pairs_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for source, name in (("train.tsv", "train.conll"), ("eval.tsv", "valid.conll")):
        with open(os.path.join(pairs_dir, source), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write("-DOCSTART- -X- -X- O\n\n")
            for r in rows:
                words = r["#2 String"].split()
                f.write("".join(f"{w} NN O {t}\n" for w, t in zip(words, tags_of(words))) + "\n")
        print(f"make_conll: {len(rows)} sentences -> {os.path.join(out_dir, name)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
