"""Reference tokenizations from Hugging Face's BertTokenizer, for tests/data/tokenizer_parity_test.cpp.

Writes <out>/tokenizer/{vocab.txt, cases.json}: a WordPiece vocabulary learned by Hugging Face tokenizers'
WordPieceTrainer on a small corpus, then for lower-cased and cased BertTokenizers over that vocabulary the tokens
and ids of texts chosen to exercise every rule: accents, punctuation, CJK, control characters, unknown words,
over-long words, whitespace of every kind, truncation and padding; and sentence pairs and texts split into words
(is_split_into_words, with each token's word) through BertTokenizerFast.
"""
import json
import os
import sys

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import BertTokenizer, BertTokenizerFast

CORPUS = [
    "a large red circle on the left and two small blue squares at the top",
    "three small green triangles in the middle",
    "Hello, world! Isn't tokenization fun? Unaffable and unbelievable.",
    "Café au lait, naïve résumé, façade, coöperate, Ångström.",
    "The quick brown fox jumps over the lazy dog; 12345 + 678 = 13023.",
    "email@example.com http://example.com/path?query=1#frag",
    "中文字符 and 日本語 mixed with English words",
    "don't stop believing, it's (really) [quite] {nice} <ok> ~fine~",
    "running runner runs ran unrunnable rerun",
]

TEXTS = [
    "a large red circle on the left",
    "Hello, World!!",
    "Unaffable UNBELIEVABLE unbelievably",
    "Café NAÏVE résumé Ångström",
    "Cafe\u0301 decomposed e\u0301",
    "中文字符mixed日本語",
    "tab\tnew\nline\r\nreturn   spaces\u00a0nbsp\u3000ideographic",
    "control\x07chars\x00and\ufffdreplacement\u200bzero width",
    "emoji 😀 and symbols ©®™ ±§",
    "x" * 120 + " long word",
    "don't (stop) [now]... {ok}",
    "",
    "   ",
    "zzzqqq unknownish",
    "12345 678 13023",
    "email@example.com http://example.com/path?query=1#frag",
    "running runner rerun unrunnable",
]


def main(out_dir: str) -> None:
    out = os.path.join(out_dir, "tokenizer")
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], min_frequency=1)
    tok.train_from_iterator(CORPUS + [t.lower() for t in CORPUS], trainer)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    vocab_path = os.path.join(out, "vocab.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        for token, _ in vocab:
            f.write(token + "\n")

    cases = {}
    for name, lower in (("lowercase", True), ("cased", False)):
        bert = BertTokenizer(vocab_path, do_lower_case=lower)
        rows = []
        for text in TEXTS:
            encoded = bert(text, padding="max_length", truncation=True, max_length=16)
            rows.append({"text": text, "tokens": bert.tokenize(text), "ids16": encoded["input_ids"],
                         "mask16": encoded["attention_mask"]})
        cases[name] = rows
    # Sentence pairs through the fast tokenizer (what AutoTokenizer gives): [CLS] a [SEP] b [SEP], token types, and
    # longest-first truncation at several lengths, ties included.
    fast = BertTokenizerFast(vocab_path, do_lower_case=True)
    pairs = []
    for i, first in enumerate(TEXTS):
        for second in (TEXTS[(i + 1) % len(TEXTS)], TEXTS[(i + 5) % len(TEXTS)], first):
            for length in (8, 11, 16, 40):
                encoded = fast(first, second, padding="max_length", truncation=True, max_length=length)
                pairs.append({"first": first, "second": second, "length": length, "ids": encoded["input_ids"],
                              "types": encoded["token_type_ids"], "mask": encoded["attention_mask"]})
    cases["pairs"] = pairs
    # Texts already split into words (token classification's input, run_ner's): is_split_into_words, each word
    # tokenized alone (a word of punctuation splits further, an empty one gives nothing), the word of each token.
    words = []
    for i, text in enumerate(TEXTS):
        split = text.split() + (["U.N.", "", "re-run"] if i % 4 == 0 else [])
        for length in (8, 16, 40):
            encoded = fast(split, is_split_into_words=True, padding="max_length", truncation=True, max_length=length)
            words.append({"words": split, "length": length, "ids": encoded["input_ids"],
                          "word_ids": [-1 if w is None else w for w in encoded.word_ids()]})
    cases["words"] = words
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
