"""Reference encodings from Hugging Face's `tokenizers`, for tests/data/tokenizer_json_test.cpp.

Writes <out>/tokenizer_json/<kind>/{tokenizer.json, tokenizer_config.json} for tokenizers shaped like the ones
models ship, each trained here on a small corpus (no downloads):
  bert     WordPiece, BertNormalizer (lower-casing), BertPreTokenizer, [CLS] $A [SEP] template, WordPiece decoder
  gpt2     byte-level BPE with GPT-2's pattern, <|endoftext|>; also as vocab.json and merges.txt alone (gpt2-files),
           encoded by what transformers' GPT2Tokenizer makes of them
  llama3   byte-level BPE behind Llama 3's Split pattern, ignore_merges, <|begin_of_text|> template
  llama2   SentencePiece BPE with byte fallback (Prepend/Replace normalizers, <s> template, ByteFallback decoder),
           converted from a sentencepiece model as transformers' LlamaConverter does
  t5       Unigram with SentencePiece's precompiled nmt_nfkc map, Metaspace, $A </s>, <extra_id_N> added tokens
  mixed    NFKD/StripAccents/Lowercase/Strip, WhitespaceSplit + Split + Punctuation + Digits, BPE with "##" and
           "</w>", BertProcessing, added tokens with lstrip/rstrip and a normalized one
and the t5/llama2 sentencepiece .model files themselves (<kind>/spiece.model), with sentencepiece's own ids.
cases.json holds, per kind and text: the ids without special tokens, the encoding truncated and padded to a few
lengths (ids, type ids, mask), sentence pairs, and the decoded text with and without special tokens.
"""
import io
import json
import os
import sys

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "a large red circle on the left and two small blue squares at the top",
    "three small green triangles in the middle of the picture",
    "Hello, world! Isn't tokenization fun? Unaffable and unbelievable.",
    "Café au lait, naïve résumé, façade, coöperate, Ångström. ﬁne ① ＦＵＬＬ width",
    "The quick brown fox jumps over the lazy dog; 12345 + 678 = 13023.",
    "email@example.com http://example.com/path?query=1#frag",
    "中文字符 and 日本語 mixed with English words, 한국어 too",
    "don't stop believing, it's (really) [quite] {nice} <ok> ~fine~",
    "running runner runs ran unrunnable rerun well-known state-of-the-art",
    "Привет мир, γειά σου κόσμε, مرحبا بالعالم",
]

TEXTS = [
    "a large red circle on the left",
    "Hello, World!!",
    "Unaffable UNBELIEVABLE unbelievably",
    "Café NAÏVE résumé Ångström",
    "Cafe\u0301 decomposed e\u0301 and precomposed é",
    "中文字符mixed日本語 한국어",
    "tab\tnew\nline\r\nreturn   spaces\u00a0nbsp\u3000ideographic",
    "control\x07chars and\ufffdreplacement\u200bzero width",
    "emoji 😀 and symbols ©®™ ±§ 🏳️‍🌈 flags",
    "x" * 120 + " long word",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "don't (stop) [now]... {ok} I'm you'll we've they'd",
    "",
    "   ",
    "  leading and trailing  ",
    "multiple     spaces    between",
    "12345 678 13023 3.14159 1,000,000",
    "email@example.com http://example.com/path?query=1#frag",
    "running runner rerun unrunnable well-known",
    "ﬁne ① ＦＵＬＬ width ㎏ Ⅻ",
    "Привет мир γειά σου مرحبا",
    "special <|endoftext|> inside <s> and </s> [SEP] <extra_id_0> text",
    "<|begin_of_text|>starts with a special token",
    "x<sep>y  <sep>  z hello world Hello World",
    "İstanbul ΣΊΣΥΦΟΣ straße",
]

LENGTHS = (6, 12, 64)
PAIR_LENGTHS = (9, 16, 48)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def sentencepiece_model(kind: str, vocab_size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 5), model_writer=out, vocab_size=vocab_size, model_type=kind,
        character_coverage=1.0, byte_fallback=kind == "bpe", pad_id=0 if kind == "unigram" else -1,
        eos_id=1 if kind == "unigram" else 2, unk_id=2 if kind == "unigram" else 0, bos_id=-1 if kind == "unigram" else 1,
        minloglevel=2)
    return out.getvalue()


def bert() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


def byte_level(pattern: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=pattern))
    if pattern:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if pattern:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def llama2(model: bytes) -> Tokenizer:
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    path = "/tmp/_llama2_spm.model"
    with open(path, "wb") as f:
        f.write(model)
    extracted = SentencePieceExtractor(path).extract(models.BPE)
    vocab, merges = extracted["vocab"], extracted["merges"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken("<unk>", normalized=False, special=True),
                            AddedToken("<s>", normalized=False, special=True),
                            AddedToken("</s>", normalized=False, special=True)])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def t5(model: bytes) -> Tokenizer:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    vocab = [(p.piece, p.score) for p in proto.pieces] + [(f"<extra_id_{i}>", 0.0) for i in range(9, -1, -1)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in ["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(10)]])
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def mixed() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                           normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split("-", behavior="merged_with_next"),
        pre_tokenizers.Punctuation(behavior="contiguous"), pre_tokenizers.Digits(individual_digits=True)])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"], continuing_subword_prefix="##",
        end_of_word_suffix="</w>"))
    tok.add_special_tokens([AddedToken("<sep>", lstrip=True, rstrip=True, special=True)])
    tok.add_tokens([AddedToken("hello world", normalized=True, special=False)])
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    return tok


def cases_of(tok: Tokenizer, pad_token: str) -> dict:
    pad = tok.token_to_id(pad_token)
    rows, pairs = [], []
    for text in TEXTS:
        plain = tok.encode(text, add_special_tokens=False).ids
        full = tok.encode(text).ids
        row = {"text": text, "ids": plain, "decoded": tok.decode(full, skip_special_tokens=True),
               "decoded_special": tok.decode(full, skip_special_tokens=False)}
        for length in LENGTHS:
            tok.enable_truncation(length)
            tok.enable_padding(length=length, pad_id=pad, pad_token=pad_token)
            e = tok.encode(text)
            row[f"at{length}"] = {"ids": e.ids, "types": e.type_ids, "mask": e.attention_mask}
            tok.no_truncation()
            tok.no_padding()
        rows.append(row)
    for i, first in enumerate(TEXTS):
        second = TEXTS[(i + 3) % len(TEXTS)]
        if not second:
            continue
        for length in PAIR_LENGTHS:
            tok.enable_truncation(length)
            tok.enable_padding(length=length, pad_id=pad, pad_token=pad_token)
            e = tok.encode(first, second)
            pairs.append({"first": first, "second": second, "length": length, "ids": e.ids, "types": e.type_ids,
                          "mask": e.attention_mask})
            tok.no_truncation()
            tok.no_padding()
    return {"pad_id": pad, "texts": rows, "pairs": pairs}


def main(out_dir: str) -> None:
    root = os.path.join(out_dir, "tokenizer_json")
    unigram, bpe = sentencepiece_model("unigram", 150), sentencepiece_model("bpe", 400)
    kinds = {"bert": (bert(), "[PAD]"), "gpt2": (byte_level(False), "<|endoftext|>"),
             "llama3": (byte_level(True), "<|end_of_text|>"), "llama2": (llama2(bpe), "</s>"),
             "t5": (t5(unigram), "<pad>"), "mixed": (mixed(), "[PAD]")}
    cases = {}
    for kind, (tok, pad_token) in kinds.items():
        d = os.path.join(root, kind)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"pad_token": pad_token}, f)
        cases[kind] = cases_of(tok, pad_token)
    # The GPT-2 tokenizer as older GPT-2 checkpoints keep it, vocab.json and merges.txt alone, and what transformers'
    # GPT2Tokenizer makes of those files.
    d = os.path.join(root, "gpt2-files")
    os.makedirs(d, exist_ok=True)
    kinds["gpt2"][0].model.save(d)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "pad_token": "<|endoftext|>"}, f)
    from transformers import AutoTokenizer
    cases["gpt2-files"] = cases_of(AutoTokenizer.from_pretrained(d).backend_tokenizer, "<|endoftext|>")
    # The sentencepiece files themselves: sentencepiece's ids, and T5's / Llama's special tokens around them.
    for kind, model, bos, eos in (("t5", unigram, False, True), ("llama2", bpe, True, False)):
        path = os.path.join(root, kind, "spiece.model")
        with open(path, "wb") as f:
            f.write(model)
        sp = spm.SentencePieceProcessor(model_file=path)
        cases[kind]["sentencepiece"] = {
            "add_bos": bos, "add_eos": eos,
            "texts": [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in TEXTS]}
    with open(os.path.join(root, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    print("wrote", root, {k: len(v["texts"]) + len(v["pairs"]) for k, v in cases.items()})


if __name__ == "__main__":
    main(sys.argv[1])
