"""Hugging Face datasets' own Arrow and Parquet files, for the C++ readers (tests/data/table_files_test.cpp).

Usage: datasets_reference.py OUT

Writes into OUT/datasets/ what datasets and pyarrow write, and expected.json: for each case the files to read, the
kind and fields to read them with, and per row what a sample must hold (or the error reading it must give), or the
error opening them must give.
  mrpc/         Dataset.save_to_disk in 2 shards: sentence pairs, a ClassLabel, unicode, an empty and a null text
  cache/        load_dataset("json", ...)'s cache directory (train and validation side by side)
  batches.arrow datasets' ArrowWriter in record batches of 3 rows: large_string, int8 and string labels, bool, a
                float, a list, a struct and a timestamp column (stepped over), nulls
  images/       save_to_disk of an Image column (bytes embedded) with a ClassLabel and captions
  paths.arrow   an Image column holding only paths (what the cache holds for local image files)
  file.arrow, legacy.arrow, dictionary.arrow, zstd.arrow: pyarrow's file format, the stream without continuation
                markers (before Arrow 0.15), a dictionary-encoded column, a compressed body
  hub/data/     Parquet files of two splits, as a Hub dataset repository holds them (datasets' to_parquet)
  parquet_*.parquet: batches.arrow's table through pyarrow's Parquet writer, every compression read (and brotli,
                refused), data pages v1 and v2, with and without dictionaries, row groups of 3 rows, pages of 2
                rows; DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY columns; images.parquet
  tokenized/    a tokenized dataset: dataset.map(BertTokenizerFast) of sentence pairs (input_ids, token_type_ids,
                attention_mask beside the texts), save_to_disk, to_parquet and to_json; padded to max_length, right
                and left; pyarrow's Parquet of it with every compression, v1/v2 pages, pages of 2 rows, delta-encoded;
                a damaged .jsonl; seq2seq's input_ids and labels (text_target), padded with -100 too; lists with
                a null item, a null
                list, an empty one; large_list and fixed_size_list; a list of lists (not token ids)
  stsb/         a regression's float labels (GLUE STS-B's similarity): datasets' float32 column, pyarrow's float64
                in every Parquet encoding of floats, float16, .jsonl numbers, .tsv decimals
  clm/          run_clm's packed stream of 60 documents (tokenize_function, group_texts) by a byte-level BPE with
                and without <s>: expected.json holds the blocks and the whole stream
  dict/         DatasetDict.save_to_disk (a directory per split); truncated.arrow, not-arrow.arrow: damaged
"""
import io
import json
import os
import shutil
import sys

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Sequence, Value
from datasets.arrow_writer import ArrowWriter
from PIL import Image as PILImage

datasets.disable_progress_bars()


def png(color, size=5):
    buf = io.BytesIO()
    PILImage.new("RGB", (size, size), color).save(buf, format="PNG")
    return buf.getvalue()


def rows(texts=None, pairs=None, labels=None, images=None, errors=None, ids=None, types=None, pair_ids=None,
         scores=None, label_sets=None, words=None, word_labels=None):
    """The expected samples: one dict per row."""
    n = len(next(x for x in (texts, labels, images, ids, scores, label_sets, words) if x is not None))
    out = []
    for i in range(n):
        if errors and errors[i]:
            out.append({"error": errors[i]})
            continue
        fields = (("text", texts), ("pair", pairs), ("label", labels), ("image", images), ("ids", ids),
                  ("types", types), ("pair_ids", pair_ids), ("score", scores), ("label_set", label_sets),
                  ("words", words), ("word_labels", word_labels))
        r = {key: values[i] for key, values in fields if values is not None}
        if "image" in r:
            r["image"] = r["image"].hex()
        out.append(r)
    return out


def tokenized_cases(root, mrpc, names, cases):
    """A tokenized dataset, as transformers' run_glue makes one (dataset.map(tokenizer, batched=True)), in the files
    datasets writes, and lists in every shape pyarrow writes them."""
    from transformers import BertTokenizerFast
    d = os.path.join(root, "tokenized")
    os.makedirs(d)
    texts = list(mrpc["sentence1"]) + [x or "" for x in mrpc["sentence2"]]
    words = sorted({w for t in texts for w in t.lower().split()})
    vocab = os.path.join(d, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words) + "\n")
    tok = BertTokenizerFast(vocab, do_lower_case=True)
    pairs = mrpc.map(lambda b: {"sentence2": [x or "" for x in b["sentence2"]]}, batched=True)
    plain = pairs.map(lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=12), batched=True)
    padded = pairs.map(lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=16,
                                     padding="max_length"), batched=True)
    tok.padding_side = "left"
    left = pairs.map(lambda b: tok(b["sentence1"], b["sentence2"], truncation=True, max_length=16,
                                   padding="max_length"), batched=True)
    plain.save_to_disk(os.path.join(d, "plain"))
    padded.save_to_disk(os.path.join(d, "padded"))
    left.save_to_disk(os.path.join(d, "left"))
    plain.to_parquet(os.path.join(d, "plain.parquet"))
    plain.to_json(os.path.join(d, "plain.jsonl"))
    labels = list(mrpc["label"])
    want = rows(labels=labels, ids=plain["input_ids"], types=plain["token_type_ids"])
    # No data.text_fields: a table without "text" but with input_ids is read as tokens.
    cases["tokenized"] = {"paths": [os.path.join(d, "plain")], "kind": "text", "label": "label", "classes": names,
                          "rows": want}
    cases["tokenized_named"] = dict(cases["tokenized"], text=["input_ids"])
    cases["tokenized_padded"] = dict(cases["tokenized"], paths=[os.path.join(d, "padded")])
    cases["tokenized_left"] = dict(cases["tokenized"], paths=[os.path.join(d, "left")])
    cases["tokenized_parquet"] = dict(cases["tokenized"], paths=[os.path.join(d, "plain.parquet")])
    cases["tokenized_json"] = dict(cases["tokenized"], paths=[os.path.join(d, "plain.jsonl")])
    with open(os.path.join(d, "bad.jsonl"), "w") as f:
        f.write('{"input_ids": [2, 5, 3], "attention_mask": [1, 1]}\n{"input_ids": [2, "x", 3]}\n'
                '{"input_ids": [2, 6, 3], "attention_mask": [1, 1, 0]}\n')
    cases["tokenized_json_damaged"] = {"paths": [os.path.join(d, "bad.jsonl")], "kind": "text", "rows": rows(
        ids=[[], [], [2, 6]], errors=["'attention_mask' holds 2 values for 3 token ids",
                                      "\"input_ids\" holds \"x\", not a whole number", None])}
    cases["tokenized_with_text"] = {"paths": [os.path.join(d, "plain")], "kind": "text",
                                    "text": ["input_ids", "sentence1"],
                                    "open_error": "data.text_fields [input_ids, sentence1] mix token ids and text"}
    # seq2seq as run_summarization tokenizes: tok(inputs, text_target=targets); padded, the labels' padding -100.
    seq = pairs.map(lambda b: tok(b["sentence1"], text_target=b["sentence2"], truncation=True, max_length=12),
                    batched=True)
    seq.save_to_disk(os.path.join(d, "seq2seq"))

    def ignore_padding(b):
        out = tok(b["sentence1"], text_target=b["sentence2"], truncation=True, max_length=16, padding="max_length")
        out["labels"] = [[t if t != tok.pad_token_id else -100 for t in row] for row in out["labels"]]
        return out
    seq_padded = pairs.map(ignore_padding, batched=True)
    seq_padded.to_parquet(os.path.join(d, "seq2seq_padded.parquet"))
    seq_padded.to_json(os.path.join(d, "seq2seq_padded.jsonl"))
    want = rows(ids=seq["input_ids"], types=seq["token_type_ids"], pair_ids=seq["labels"])
    cases["seq2seq_tokenized"] = {"paths": [os.path.join(d, "seq2seq")], "kind": "text",
                                  "text": ["input_ids", "labels"], "rows": want}
    for name in ("seq2seq_padded.parquet", "seq2seq_padded.jsonl"):
        cases["seq2seq_" + name.replace(".", "_")] = dict(cases["seq2seq_tokenized"], paths=[os.path.join(d, name)])
    cases["tokenized_texts"] = {"paths": [os.path.join(d, "plain")], "kind": "text",
                                "text": ["sentence1", "sentence2"], "label": "label", "classes": names,
                                "rows": rows(list(mrpc["sentence1"]), list(pairs["sentence2"]), labels)}
    table = plain.data.table
    for codec in ("none", "snappy", "gzip", "zstd"):
        for version in ("1.0", "2.0"):
            for dictionary in (True, False):
                name = "tokenized_%s_v%s%s" % (codec, version[0], "_dict" if dictionary else "")
                path = os.path.join(d, name + ".parquet")
                pq.write_table(table, path, compression=codec, data_page_version=version,
                               use_dictionary=dictionary, row_group_size=4)
                cases[name] = dict(cases["tokenized"], paths=[path])
    for version in ("1.0", "2.0"):  # token ids delta-encoded
        path = os.path.join(d, "delta_v%s.parquet" % version[0])
        pq.write_table(table, path, use_dictionary=False, data_page_version=version,
                       column_encoding={c + ".list.element": "DELTA_BINARY_PACKED"
                                        for c in ("input_ids", "token_type_ids", "attention_mask")})
        cases["tokenized_delta_v" + version[0]] = dict(cases["tokenized"], paths=[path])
    for version in ("1.0", "2.0"):  # pages of 2 rows: a row's items found in the page that holds it
        path = os.path.join(d, "pages_v%s.parquet" % version[0])
        pq.write_table(table, path, compression="snappy", data_page_version=version, data_page_size=16,
                       write_batch_size=2, dictionary_pagesize_limit=64)
        cases["tokenized_pages_v" + version[0]] = dict(cases["tokenized"], paths=[path])

    # Lists as pyarrow writes them: null items and lists, empty lists, 64-bit offsets, a fixed size, lists of lists.
    ids = [[5, 6, 7], [None, 3], None, [], [2**40, 0], [9]]
    errors = [None, "'input_ids' has a null item", "'input_ids' is null", "no token ids", None, None]
    want = rows(ids=[x or [] for x in ids], errors=errors)
    for name, type_ in (("list", pa.list_(pa.int64())), ("large_list", pa.large_list(pa.int64()))):
        t = pa.table({"input_ids": pa.array(ids, type_)})
        with pa.ipc.new_stream(os.path.join(d, name + ".arrow"), t.schema) as w:
            w.write_table(t)
        cases["tokens_" + name] = {"paths": [os.path.join(d, name + ".arrow")], "kind": "text", "rows": want}
    for version in ("1.0", "2.0"):
        path = os.path.join(d, "nulls_v%s.parquet" % version[0])
        pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int64()))}), path, data_page_version=version,
                       row_group_size=4)
        cases["tokens_parquet_v" + version[0]] = {"paths": [path], "kind": "text", "rows": want}
        path = os.path.join(d, "nulls_delta_v%s.parquet" % version[0])  # 2**40 and back: 64-bit deltas
        pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int64()))}), path, data_page_version=version,
                       use_dictionary=False, column_encoding={"input_ids.list.element": "DELTA_BINARY_PACKED"})
        cases["tokens_parquet_delta_v" + version[0]] = {"paths": [path], "kind": "text", "rows": want}
    fixed = pa.table({"input_ids": pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.int16(), 3)),
                      "token_type_ids": pa.array([[0, 0, 1], [0, 1, 1]], pa.list_(pa.int8(), 3))})
    with pa.ipc.new_stream(os.path.join(d, "fixed.arrow"), fixed.schema) as w:
        w.write_table(fixed)
    cases["tokens_fixed_size"] = {"paths": [os.path.join(d, "fixed.arrow")], "kind": "text",
                                  "rows": rows(ids=[[1, 2, 3], [4, 5, 6]], types=[[0, 0, 1], [0, 1, 1]])}
    nested = pa.table({"input_ids": pa.array([[[1, 2]], [[3]]], pa.list_(pa.list_(pa.int64())))})
    pq.write_table(nested, os.path.join(d, "nested.parquet"))
    cases["tokens_nested"] = {"paths": [os.path.join(d, "nested.parquet")], "kind": "text", "text": ["input_ids"],
                              "open_error": "column 'input_ids' (data.text_fields) holds list, expected strings"}


def score_cases(root, cases):
    """A regression's float labels, as GLUE's STS-B holds them (sentence pairs, a similarity 0-5 as float32): datasets'
    save_to_disk and to_parquet; pyarrow's Parquet of float64 scores with every encoding it writes floats in
    (dictionary, PLAIN, BYTE_STREAM_SPLIT) in v1 and v2 pages, with a null; float16 in Arrow; .jsonl numbers and
    .tsv decimal strings; a score that is no number."""
    d = os.path.join(root, "stsb")
    os.makedirs(d)
    s1 = ["A plane is taking off.", "A man is playing a flute.", "A cat sits.", "Two dogs run.", "Rain falls."]
    s2 = ["An air plane is taking off.", "A man plays a flute.", "A dog runs.", "Dogs are running.", "Sun shines."]
    scores = [5.0, 3.8, 0.25, 4.2, 0.0]
    stsb = Dataset.from_dict({"sentence1": s1, "sentence2": s2, "label": scores},
                             features=Features({"sentence1": Value("string"), "sentence2": Value("string"),
                                                "label": Value("float32")}))
    stsb.save_to_disk(os.path.join(d, "arrow"))
    stsb.to_parquet(os.path.join(d, "stsb.parquet"))
    want = rows(s1, s2, scores=scores)
    base = {"kind": "text", "text": ["sentence1", "sentence2"], "label": "label", "scores": True, "rows": want}
    cases["stsb_arrow"] = dict(base, paths=[os.path.join(d, "arrow")])
    cases["stsb_parquet"] = dict(base, paths=[os.path.join(d, "stsb.parquet")])
    with_null = scores[:2] + [None] + scores[3:]
    null_rows = rows(s1, s2, scores=[x if x is not None else 0.0 for x in with_null],
                     errors=[None, None, "label 'score' is null", None, None])
    table = pa.table({"sentence1": s1, "sentence2": s2, "score": pa.array(with_null, pa.float64())})
    for version in ("1.0", "2.0"):
        for name, options in (("dict", {}), ("plain", {"use_dictionary": False}),
                              ("split", {"use_dictionary": False, "use_byte_stream_split": ["score"]})):
            path = os.path.join(d, "score_%s_v%s.parquet" % (name, version[0]))
            pq.write_table(table, path, data_page_version=version, row_group_size=3, **options)
            cases["scores_%s_v%s" % (name, version[0])] = dict(base, paths=[path], label="score", rows=null_rows)
    half = pa.table({"sentence1": s1, "sentence2": s2, "label": pa.array(scores, pa.float16())})
    with pa.ipc.new_stream(os.path.join(d, "half.arrow"), half.schema) as w:
        w.write_table(half)
    cases["scores_float16"] = dict(base, paths=[os.path.join(d, "half.arrow")])
    with open(os.path.join(d, "stsb.jsonl"), "w") as f:
        for a, b, x in zip(s1, s2, scores):
            f.write(json.dumps({"sentence1": a, "sentence2": b, "label": x}) + "\n")
        f.write(json.dumps({"sentence1": "x", "sentence2": "y", "label": "high"}) + "\n")
    cases["scores_jsonl"] = dict(base, paths=[os.path.join(d, "stsb.jsonl")],
                                 rows=want + [{"error": "label 'high' is not a number"}])
    with open(os.path.join(d, "stsb.tsv"), "w") as f:  # GLUE's STS-B train.tsv keeps the score as text
        f.write("sentence1\tsentence2\tscore\n")
        for a, b, x in zip(s1, s2, scores):
            f.write("%s\t%s\t%s\n" % (a, b, x))
    cases["scores_tsv"] = dict(base, paths=[os.path.join(d, "stsb.tsv")], label="score")
    cases["scores_text_column"] = dict(base, paths=[os.path.join(d, "arrow")], text=["sentence1"], label="sentence2",
                                       rows=rows(s1, errors=["label '%s' is not a number" % x for x in s2]))
    mrpc_texts = ["The cat sat.", "Ünïcödé — 東京 🙂", "", "tab\there", "last one", "six"]  # main()'s s1
    cases["scores_classes"] = dict(base, paths=[os.path.join(root, "mrpc")], text=["sentence1"], label="label",
                                   rows=rows(mrpc_texts, scores=[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]))


def multi_label_cases(root, cases):
    """Multi-label classification's sets of classes, as go_emotions holds them (a List(ClassLabel) per text, some
    empty): datasets' save_to_disk and to_parquet; pyarrow's Parquet with a null list and an id beyond the classes;
    .jsonl arrays of names and ids with a repeat and a name that is no class; refused: a .tsv, a column of single
    labels, and sets without the classes named."""
    d = os.path.join(root, "multi_label")
    os.makedirs(d)
    names = ["admiration", "anger", "joy", "neutral"]
    texts = ["So proud of you!", "This is infuriating.", "Nice, thanks :)", "ok", "Wow, great but also annoying"]
    sets = [[0, 2], [1], [2], [], [0, 1, 2]]
    ds = Dataset.from_dict({"text": texts, "labels": sets},
                           features=Features({"text": Value("string"), "labels": Sequence(ClassLabel(names=names))}))
    ds.save_to_disk(os.path.join(d, "arrow"))
    ds.to_parquet(os.path.join(d, "ml.parquet"))
    base = {"kind": "text", "text": ["text"], "label": "labels", "classes": names, "multi_label": True,
            "rows": rows(texts, label_sets=sets)}
    cases["multi_label_arrow"] = dict(base, paths=[os.path.join(d, "arrow")])
    cases["multi_label_parquet"] = dict(base, paths=[os.path.join(d, "ml.parquet")])
    odd = pa.table({"text": texts, "labels": pa.array([[2, 0], None, [7], [], [1]], pa.list_(pa.int64()))})
    pq.write_table(odd, os.path.join(d, "odd.parquet"))
    cases["multi_label_odd"] = dict(base, paths=[os.path.join(d, "odd.parquet")], rows=rows(
        texts, label_sets=[[0, 2], [], [], [], [1]],
        errors=[None, "label 'labels' is null", "label '7' is not one of the classes", None, None]))
    with open(os.path.join(d, "ml.jsonl"), "w") as f:
        for t, ids in zip(texts, sets):
            f.write(json.dumps({"text": t, "labels": [names[i] for i in ids]}) + "\n")
        f.write(json.dumps({"text": "ids", "labels": [3, "joy", 3]}) + "\n")
        f.write(json.dumps({"text": "a name", "labels": ["sadness"]}) + "\n")
        f.write(json.dumps({"text": "one label", "labels": "joy"}) + "\n")
    cases["multi_label_jsonl"] = dict(base, paths=[os.path.join(d, "ml.jsonl")], rows=rows(
        texts + ["ids", "a name", "one label"], label_sets=sets + [[2, 3], [], []],
        errors=[None] * 6 + ["label 'sadness' is not one of the classes", "holding an array of class names or ids"]))
    with open(os.path.join(d, "ml.tsv"), "w") as f:  # go_emotions' own files: ids separated by commas
        f.write("text\tlabels\n")
        for t, ids in zip(texts, sets):
            f.write("%s\t%s\n" % (t, ",".join(str(i) for i in ids)))
        f.write("names\tjoy, anger ,joy\nbad\t2,9\n")
    cases["multi_label_tsv"] = dict(base, paths=[os.path.join(d, "ml.tsv")], rows=rows(
        texts + ["names", "bad"], label_sets=sets + [[1, 2], []],
        errors=[None] * 6 + ["label '9' is not one of the classes"]))
    with open(os.path.join(d, "ml.txt"), "w") as f:
        f.write("a text\n")
    cases["multi_label_txt"] = dict(base, paths=[os.path.join(d, "ml.txt")],
                                    open_error="a multi-label sample's set of classes is a .jsonl array")
    cases["multi_label_single_column"] = dict(base, paths=[os.path.join(root, "mrpc")], text=["sentence1"],
                                              label="label", open_error="expected lists of class ids")
    cases["multi_label_no_classes"] = dict(base, paths=[os.path.join(d, "arrow")], classes=[],
                                           open_error="multi-label data needs its classes named")


def word_cases(root, cases):
    """Token classification's words and tags, as CoNLL-2003 holds them (tokens: List(Value(string)), ner_tags:
    List(ClassLabel)): datasets' save_to_disk and to_parquet; pyarrow's Parquet with and without a dictionary, page
    versions 1 and 2, DELTA_BYTE_ARRAY words, small pages, a null word, a row with fewer tags than words, tags as
    names; .jsonl arrays of names and ids; refused: a .tsv, no classes, a ClassLabel of other names."""
    d = os.path.join(root, "words")
    os.makedirs(d)
    names = ["O", "B-PER", "I-PER", "B-LOC"]
    words = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"], [], ["Ünïcödé", "東京", "🙂", ""],
             ["BRUSSELS", "1996-08-22"] * 30]
    tags = [[0, 0, 3, 0], [1, 2], [], [0, 3, 0, 0], [3, 0] * 30]
    ds = Dataset.from_dict({"id": [str(i) for i in range(len(words))], "tokens": words, "ner_tags": tags},
                           features=Features({"id": Value("string"), "tokens": Sequence(Value("string")),
                                              "ner_tags": Sequence(ClassLabel(names=names))}))
    ds.save_to_disk(os.path.join(d, "arrow"))
    ds.to_parquet(os.path.join(d, "hub.parquet"))
    base = {"kind": "text", "text": ["tokens"], "label": "ner_tags", "classes": names, "words": True,
            "rows": rows(words=words, word_labels=tags)}
    cases["words_arrow"] = dict(base, paths=[os.path.join(d, "arrow")])
    cases["words_parquet_hub"] = dict(base, paths=[os.path.join(d, "hub.parquet")])
    table = pa.table({"tokens": pa.array(words, pa.list_(pa.string())),
                      "ner_tags": pa.array(tags, pa.list_(pa.int32()))})
    for version in ("1.0", "2.0"):
        for dictionary in (True, False):
            path = os.path.join(d, "v%s_%s.parquet" % (version[0], "dict" if dictionary else "plain"))
            pq.write_table(table, path, data_page_version=version, use_dictionary=dictionary, data_page_size=64,
                           write_batch_size=2)
            cases["words_parquet_v%s_%s" % (version[0], "dict" if dictionary else "plain")] = dict(base, paths=[path])
        path = os.path.join(d, "v%s_delta.parquet" % version[0])
        pq.write_table(table, path, data_page_version=version, use_dictionary=False,
                       column_encoding={"tokens": "DELTA_BYTE_ARRAY", "ner_tags": "DELTA_BINARY_PACKED"})
        cases["words_parquet_delta_v" + version[0]] = dict(base, paths=[path])
    odd = pa.table({"tokens": pa.array([["a", None], ["b", "c"], None, ["d"]], pa.list_(pa.string())),
                    "ner_tags": pa.array([["O", "O"], ["B-PER"], ["O"], ["I-PER"]], pa.list_(pa.string()))})
    for fmt in ("parquet", "arrow"):
        path = os.path.join(d, "odd." + fmt)
        if fmt == "parquet":
            pq.write_table(odd, path)
        else:
            with pa.ipc.new_stream(path, odd.schema) as w:
                w.write_table(odd)
        cases["words_odd_" + fmt] = dict(base, paths=[path], rows=rows(
            words=[[], [], [], ["d"]], word_labels=[[], [], [], [2]],
            errors=["has a null item", "1 classes in 'ner_tags' for 2 words", "column 'tokens' is null", None]))
    with open(os.path.join(d, "words.jsonl"), "w") as f:
        for w, t in zip(words, tags):
            f.write(json.dumps({"tokens": w, "ner_tags": [names[i] for i in t]}) + "\n")
        f.write(json.dumps({"tokens": ["ids"], "ner_tags": [1]}) + "\n")
        f.write(json.dumps({"tokens": ["x", "y"], "ner_tags": ["O"]}) + "\n")
        f.write(json.dumps({"tokens": ["x"], "ner_tags": ["B-ORG"]}) + "\n")
        f.write(json.dumps({"tokens": "x y", "ner_tags": ["O"]}) + "\n")
    cases["words_jsonl"] = dict(base, paths=[os.path.join(d, "words.jsonl")], rows=rows(
        words=words + [["ids"], [], [], []], word_labels=tags + [[1], [], [], []],
        errors=[None] * 6 + ["holding a class for each of the 2 words of \"tokens\" (it holds 1)",
                             "label 'B-ORG' is not one of the classes", "holding an array of words"]))
    # CoNLL-2003's own files: "word POS chunk tag" lines, blank lines between sentences, -DOCSTART- between
    # documents; here also CRLF ends, tabs, runs of blank lines, and no newline at the end (as the files are read by
    # datasets' conll2003 script: the first field the word, the last the tag)
    conll = ("-DOCSTART- -X- -X- O\n\nEU NNP B-NP O\nrejects VBZ B-VP O\nGerman JJ B-NP B-LOC\r\ncall NN I-NP O\n\n\n"
             "Peter\tNNP\tB-NP\tB-PER\nBlackburn NNP I-NP I-PER\n \n-DOCSTART- -X- -X- O\n\nlonely\nword O\n\n"
             "x O\ny B-ORG\n\nlast O\nline B-LOC")
    conll_rows = rows(words=[["EU", "rejects", "German", "call"], ["Peter", "Blackburn"], [], [], ["last", "line"]],
                      word_labels=[[0, 0, 3, 0], [1, 2], [], [], [0, 3]],
                      errors=[None, None, "line 14 ('lonely') holds 1 field", "label 'B-ORG' is not one of the classes",
                              None])
    for ext in ("conll", "txt"):
        with open(os.path.join(d, "eng." + ext), "w", newline="") as f:
            f.write(conll)
        cases["words_" + ext] = dict(base, paths=[os.path.join(d, "eng." + ext)], rows=conll_rows)
    cases["conll_not_words"] = dict(base, paths=[os.path.join(d, "eng.conll")], words=False,
                                    open_error="a .conll file holds words and their tags")
    with open(os.path.join(d, "words.tsv"), "w") as f:
        f.write("tokens\tner_tags\nEU rejects\t0 0\n")
    cases["words_tsv"] = dict(base, paths=[os.path.join(d, "words.tsv")],
                              open_error="token classification's words and their classes are .jsonl arrays")
    cases["words_no_classes"] = dict(base, paths=[os.path.join(d, "arrow")], classes=[],
                                     open_error="the classes named (data.labels")
    cases["words_other_names"] = dict(base, paths=[os.path.join(d, "arrow")], classes=["O", "B-LOC", "I-PER", "B-PER"],
                                      open_error="holds the classes [O, B-PER, I-PER, B-LOC]")
    cases["words_text_column"] = dict(base, paths=[os.path.join(d, "arrow")], text=["id"],
                                      open_error="expected lists of words (strings)")


def group_texts_cases(root):
    """Causal LM's packed stream as transformers' run_clm makes it: tokenize_function (tokenizer(examples["text"]))
    then group_texts (each map batch's ids end to end, cut into blocks of block_size, the remainder dropped), over
    documents of 1 to 40 words, by a GPT-2-like byte-level BPE (no special tokens) and a Llama-like one (<s> before
    each document). Writes clm/expected.json: per tokenizer the blocks and the whole stream, and the stream with the
    end of text appended to each document (tokenizer(text)["input_ids"] + [eos_token_id], torchtitan's separation:
    data.packing_eos)."""
    from itertools import chain

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    d = os.path.join(root, "clm")
    os.makedirs(d)
    words = ("the cat sat on a mat while seven red circles rolled past blue squares near Tokyo and Zürich "
             "every day").split()
    docs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(1 + (i * 13) % 40)) for i in range(60)]
    Dataset.from_dict({"text": docs}).save_to_disk(os.path.join(d, "texts"))
    with open(os.path.join(d, "texts.txt"), "w") as f:
        f.write("\n".join(docs) + "\n")
    block_size = 16

    def group_texts(examples):  # run_clm's, word for word in effect
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        return {k: [t[i: i + block_size] for i in range(0, total_length, block_size)]
                for k, t in concatenated.items()}
    want = {"block_size": block_size}
    for name, bos in (("gpt2", False), ("llama", True)):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = ["<s>", "<|endoftext|>"] if bos else ["<|endoftext|>"]
        tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.post_processor = (processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)]) if bos
                              else processors.ByteLevel(trim_offsets=False))
        path = os.path.join(d, name + ".json")
        tok.save(path)
        fast = PreTrainedTokenizerFast(tokenizer_file=path, eos_token="<|endoftext|>")
        tokenized = Dataset.from_dict({"text": docs}).map(lambda b: fast(b["text"]), batched=True,
                                                           remove_columns=["text"])
        grouped = tokenized.map(group_texts, batched=True)
        want[name] = {"tokenizer": path, "blocks": list(grouped["input_ids"]),
                      "stream": list(chain(*tokenized["input_ids"])),
                      "stream_eos": list(chain(*(ids + [fast.eos_token_id] for ids in tokenized["input_ids"])))}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(want, f)


def main(out):
    root = os.path.join(out, "datasets")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    cases = {}

    # Sentence pairs with a ClassLabel, as GLUE's MRPC, in two shards.
    s1 = ["The cat sat.", "Ünïcödé — 東京 🙂", "", "tab\there", "last one", "six"]
    s2 = ["A cat sat.", "x", "empty first", None, "the end", "seven"]
    label = [1, 0, 1, 0, 1, 0]
    names = ["not_equivalent", "equivalent"]
    mrpc = Dataset.from_dict({"sentence1": s1, "sentence2": s2, "label": label, "idx": list(range(6))},
                             features=Features({"sentence1": Value("string"), "sentence2": Value("string"),
                                                "label": ClassLabel(names=names), "idx": Value("int32")}))
    mrpc.save_to_disk(os.path.join(root, "mrpc"), num_shards=2)
    errors = [None, None, None, "'sentence2' is null", None, None]
    cases["mrpc"] = {"paths": [os.path.join(root, "mrpc")], "kind": "text", "text": ["sentence1", "sentence2"],
                     "label": "label", "classes": names,
                     "rows": rows(s1, [x or "" for x in s2], label, errors=errors)}
    cases["mrpc_names_swapped"] = {"paths": [os.path.join(root, "mrpc")], "kind": "text", "text": ["sentence1"],
                                   "label": "label", "classes": list(reversed(names)),
                                   "open_error": "holds the classes [not_equivalent, equivalent]"}
    cases["mrpc_no_column"] = {"paths": [os.path.join(root, "mrpc")], "kind": "text", "text": ["sentence"],
                               "open_error": "no column 'sentence' (data.text_fields); it has [sentence1 (string)"}
    cases["mrpc_int_text"] = {"paths": [os.path.join(root, "mrpc")], "kind": "text", "text": ["idx"],
                              "open_error": "column 'idx' (data.text_fields) holds int32, expected strings"}

    # load_dataset's cache: the split files side by side in one directory.
    src = os.path.join(root, "src")
    os.makedirs(src)
    for split, texts in (("train", ["alpha", "beta", "gamma"]), ("validation", ["delta"])):
        with open(os.path.join(src, split + ".jsonl"), "w") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"text": t, "label": i % 2}) + "\n")
    loaded = datasets.load_dataset("json", data_files={"train": os.path.join(src, "train.jsonl"),
                                                       "validation": os.path.join(src, "validation.jsonl")},
                                   cache_dir=os.path.join(root, "cache"))
    train_files = [f["filename"] for f in loaded["train"].cache_files]
    cache_dir = os.path.dirname(train_files[0])
    cases["cache_train"] = {"paths": train_files, "kind": "text", "text": ["text"], "label": "label",
                            "rows": rows(["alpha", "beta", "gamma"], labels=[0, 1, 0])}
    cases["cache_directory"] = {"paths": [cache_dir], "kind": "text", "text": ["text"],
                                "open_error": "holds the files of several splits (train, validation): name one's files, as"}

    # Record batches of 3 rows through datasets' own writer, with columns of every kind to step over.
    texts = ["r%d %s" % (i, "x" * i) for i in range(8)]
    texts[5] = None
    feats = Features({"text": Value("large_string"), "small": Value("int8"), "name": Value("string"),
                      "flag": Value("bool"), "score": Value("float32"), "tokens": Sequence(Value("int32")),
                      "meta": {"a": Value("int64"), "b": Value("string")}, "when": Value("timestamp[s]")})
    path = os.path.join(root, "batches.arrow")
    with ArrowWriter(features=feats, path=path, writer_batch_size=3) as w:
        for i, t in enumerate(texts):
            w.write({"text": t, "small": -1 if i == 6 else i % 3, "name": ["neg", "pos", "mid"][i % 3],
                     "flag": i % 2 == 0, "score": i / 2, "tokens": list(range(i)),
                     "meta": {"a": i, "b": str(i)}, "when": None})
        w.finalize()
    classes = ["neg", "pos", "mid"]
    errors = [None] * 8
    errors[5] = "'text' is null"
    errors[6] = "label '-1' is not one of the classes"
    cases["batches_int_label"] = {"paths": [path], "kind": "text", "text": ["text"], "label": "small",
                                  "classes": classes, "rows": rows(texts, labels=[i % 3 for i in range(8)],
                                                                   errors=errors)}
    errors = [None] * 8
    errors[5] = "'text' is null"
    cases["batches_string_label"] = {"paths": [path], "kind": "text", "text": ["text", "meta.b"], "label": "name",
                                     "classes": classes,
                                     "open_error": "no column 'meta.b' (data.text_fields)"}
    cases["batches_bool_label"] = {"paths": [path], "kind": "text", "text": ["text"], "label": "flag",
                                   "rows": rows(texts, labels=[int(i % 2 == 0) for i in range(8)], errors=errors)}
    cases["batches_names"] = {"paths": [path], "kind": "text", "text": ["name"], "label": "name", "classes": classes,
                              "rows": rows(["neg", "pos", "mid"] * 2 + ["neg", "pos"],
                                           labels=[i % 3 for i in range(8)])}
    cases["batches_list_label"] = {"paths": [path], "kind": "text", "text": ["text"], "label": "tokens",
                                   "open_error": "column 'tokens' (data.label_field) holds list"}

    # Images: save_to_disk embeds the encoded bytes; labels and captions beside them.
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (9, 9, 9)]
    encoded = [png(c) for c in colors]
    img_names = ["red", "green", "blue", "grey"]
    images = Dataset.from_dict(
        {"img": [PILImage.open(io.BytesIO(b)) for b in encoded], "caption": ["a red square", "green", "blue", "grey"],
         "label": [0, 1, 2, 3]},
        features=Features({"img": Image(), "caption": Value("string"), "label": ClassLabel(names=img_names)}))
    images.save_to_disk(os.path.join(root, "images"))
    cases["images"] = {"paths": [os.path.join(root, "images")], "kind": "image", "label": "label",
                       "classes": img_names, "rows": rows(labels=[0, 1, 2, 3], images=encoded)}
    cases["images_captions"] = {"paths": [os.path.join(root, "images")], "kind": "image_text", "text": ["caption"],
                                "rows": rows(["a red square", "green", "blue", "grey"], images=encoded)}

    # An Image column of paths only (the cache of a dataset built from local files): the files are read.
    pngs = []
    for i, b in enumerate(encoded[:2]):
        pngs.append(os.path.join(root, "img%d.png" % i))
        with open(pngs[-1], "wb") as f:
            f.write(b)
    path = os.path.join(root, "paths.arrow")
    with ArrowWriter(features=Features({"image": Image(), "text": Value("string")}), path=path) as w:
        w.write({"image": pngs[0], "text": "zero"})
        w.write({"image": "img1.png", "text": "one"})  # relative: beside the .arrow file
        w.write({"image": os.path.join(root, "missing.png"), "text": "two"})
        w.finalize()
    cases["paths"] = {"paths": [path], "kind": "image_text", "text": ["text"],
                      "rows": rows(["zero", "one", "two"], images=encoded[:2] + [b""],
                                   errors=[None, None, "its path cannot be read"])}

    # pyarrow's own formats.
    table = pa.table({"text": pa.array(["one", None, "three"]), "label": pa.array([0, 1, 1], pa.int64())})
    with pa.ipc.new_file(os.path.join(root, "file.arrow"), table.schema) as w:
        w.write_table(table)
    opts = pa.ipc.IpcWriteOptions(use_legacy_format=True)
    with pa.ipc.new_stream(os.path.join(root, "legacy.arrow"), table.schema, options=opts) as w:
        w.write_table(table)
    for name in ("file", "legacy"):
        cases[name] = {"paths": [os.path.join(root, name + ".arrow")], "kind": "text", "text": ["text"],
                       "label": "label", "rows": rows(["one", "", "three"], labels=[0, 1, 1],
                                                      errors=[None, "'text' is null", None])}
    dictionary = pa.table({"text": pa.array(["a", "b", "c"]), "cat": pa.array(["x", "y", "x"]).dictionary_encode()})
    with pa.ipc.new_stream(os.path.join(root, "dictionary.arrow"), dictionary.schema) as w:
        w.write_table(dictionary)
    cases["dictionary"] = {"paths": [os.path.join(root, "dictionary.arrow")], "kind": "text", "text": ["text"],
                           "rows": rows(["a", "b", "c"])}
    cases["dictionary_column"] = {"paths": [os.path.join(root, "dictionary.arrow")], "kind": "text", "text": ["cat"],
                                  "rows": rows(["x", "y", "x"])}
    for codec in ("zstd", "lz4"):
        opts = pa.ipc.IpcWriteOptions(compression=codec)
        with pa.ipc.new_stream(os.path.join(root, codec + ".arrow"), table.schema, options=opts) as w:
            w.write_table(table)
        cases[codec] = dict(cases["file"], paths=[os.path.join(root, codec + ".arrow")])

    # Parquet, as the Hub keeps datasets and pyarrow writes tables: datasets' to_parquet (snappy, dictionary pages)
    # in a Hub repository's layout of split files; pyarrow with each compression read, data pages v1 and v2, with
    # and without dictionaries, row groups of 3 rows, nulls, a list and a struct column beside.
    hub = os.path.join(root, "hub", "data")
    os.makedirs(hub)
    mrpc.to_parquet(os.path.join(hub, "train-00000-of-00001.parquet"))
    mrpc.select(range(2)).to_parquet(os.path.join(hub, "validation-00000-of-00001.parquet"))
    cases["parquet_datasets"] = dict(cases["mrpc"], paths=[os.path.join(hub, "train-*.parquet")])
    cases["mixed"] = dict(cases["mrpc"], paths=[os.path.join(root, "mrpc"), os.path.join(hub, "train-*.parquet"),
                                                os.path.join(root, "mrpc", "data-00001-of-00002.arrow")],
                          rows=cases["mrpc"]["rows"] * 2 + cases["mrpc"]["rows"][3:])
    cases["parquet_hub_directory"] = {"paths": [hub], "kind": "text", "text": ["sentence1"],
                                      "open_error": "holds the files of several splits (train, validation): name "
                                                    "one's files, as '" + hub + "/train*.parquet'"}
    batches = pa.ipc.open_stream(os.path.join(root, "batches.arrow")).read_all()
    for codec in ("none", "snappy", "gzip", "zstd"):
        for version in ("1.0", "2.0"):
            for dictionary in (True, False):
                name = "parquet_%s_v%s%s" % (codec, version[0], "_dict" if dictionary else "")
                path = os.path.join(root, name + ".parquet")
                pq.write_table(batches, path, compression=codec, data_page_version=version, use_dictionary=dictionary,
                               row_group_size=3)
                cases[name] = dict(cases["batches_int_label"], paths=[path])
                cases[name + "_bool"] = dict(cases["batches_bool_label"], paths=[path])
    for version in ("1.0", "2.0"):  # pages of 2 rows: rows found across pages, after a dictionary page
        path = os.path.join(root, "parquet_pages_v%s.parquet" % version[0])
        pq.write_table(batches, path, compression="snappy", data_page_version=version, data_page_size=16,
                       write_batch_size=2, dictionary_pagesize_limit=64)
        cases["parquet_pages_v" + version[0]] = dict(cases["batches_int_label"], paths=[path])
        cases["parquet_pages_v%s_bool" % version[0]] = dict(cases["batches_bool_label"], paths=[path])
    # The DELTA encodings (Spark's and parquet-mr's v2 writers use them): integers, strings by length and by prefix.
    delta = {"text": "DELTA_LENGTH_BYTE_ARRAY", "name": "DELTA_BYTE_ARRAY", "small": "DELTA_BINARY_PACKED",
             "meta.a": "DELTA_BINARY_PACKED", "tokens.list.element": "DELTA_BINARY_PACKED"}
    for version in ("1.0", "2.0"):
        path = os.path.join(root, "parquet_delta_v%s.parquet" % version[0])
        pq.write_table(batches, path, use_dictionary=False, column_encoding=delta, data_page_version=version,
                       row_group_size=5)
        cases["parquet_delta_v" + version[0]] = dict(cases["batches_int_label"], paths=[path])
        cases["parquet_delta_v%s_names" % version[0]] = dict(cases["batches_names"], paths=[path])
    images.to_parquet(os.path.join(root, "images.parquet"))
    cases["images_parquet"] = dict(cases["images"], paths=[os.path.join(root, "images.parquet")])
    for codec in ("brotli", "lz4"):
        pq.write_table(batches, os.path.join(root, codec + ".parquet"), compression=codec)
        cases["parquet_" + codec] = dict(cases["batches_int_label"], paths=[os.path.join(root, codec + ".parquet")])
    cases["parquet_list"] = {"paths": [os.path.join(root, "parquet_snappy_v1_dict.parquet")], "kind": "text",
                             "text": ["text"], "label": "tokens",
                             "open_error": "column 'tokens' (data.label_field) holds list"}
    with open(os.path.join(root, "parquet_snappy_v1_dict.parquet"), "rb") as f:
        whole = f.read()
    with open(os.path.join(root, "truncated.parquet"), "wb") as f:
        f.write(whole[: len(whole) - 100])
    cases["parquet_truncated"] = {"paths": [os.path.join(root, "truncated.parquet")], "kind": "text",
                                  "text": ["text"], "open_error": "not a Parquet file"}

    tokenized_cases(root, mrpc, names, cases)
    group_texts_cases(root)
    score_cases(root, cases)
    multi_label_cases(root, cases)
    word_cases(root, cases)

    # Damaged and misplaced.
    DatasetDict({"train": mrpc, "validation": mrpc}).save_to_disk(os.path.join(root, "dict"))
    cases["dict"] = {"paths": [os.path.join(root, "dict")], "kind": "text", "text": ["sentence1"],
                     "open_error": "holds a dataset's splits (train, validation): name one"}
    with open(os.path.join(root, "batches.arrow"), "rb") as f:
        whole = f.read()
    with open(os.path.join(root, "truncated.arrow"), "wb") as f:
        f.write(whole[: len(whole) * 2 // 3])
    cases["truncated"] = {"paths": [os.path.join(root, "truncated.arrow")], "kind": "text", "text": ["text"],
                          "open_error": "cut short"}
    with open(os.path.join(root, "not-arrow.arrow"), "wb") as f:
        f.write(b"text,label\nhello,1\n")
    cases["not_arrow"] = {"paths": [os.path.join(root, "not-arrow.arrow")], "kind": "text", "text": ["text"],
                          "open_error": "not-arrow.arrow: "}

    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
    print("datasets_reference: %d cases in %s" % (len(cases), root))


if __name__ == "__main__":
    main(sys.argv[1])
