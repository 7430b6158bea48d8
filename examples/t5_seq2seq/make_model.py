"""A small T5 as a user downloads one: T5ForConditionalGeneration with random weights written by transformers'
save_pretrained, and beside it a tokenizer.json as T5's are made: a SentencePiece Unigram model trained on the
example's texts (sentencepiece), converted as transformers converts T5's spiece.model (its pieces and scores, its
precompiled nmt_nfkc normalization map, Metaspace, </s> closing every text, <extra_id_N> sentinels), at a size this
machine trains in a minute.

usage: make_model.py OUT_DIR TRAIN_JSONL
"""
import io
import json
import sys

import sentencepiece as spm
import torch
import transformers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import T5Config, T5ForConditionalGeneration

transformers.logging.disable_progress_bar()


def tokenizer(texts):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=100,
                                   hard_vocab_limit=False, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    tok = Tokenizer(models.Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<pad>", "</s>", "<unk>"]] +
                           [AddedToken(f"<extra_id_{i}>", special=True, normalized=False) for i in range(16)])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def main(out, train_jsonl):
    torch.manual_seed(0)
    with open(train_jsonl, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    tok = tokenizer([r["input"] for r in records] + [r["target"] for r in records])
    config = T5Config(vocab_size=tok.get_vocab_size(), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      feed_forward_proj="relu", tie_word_embeddings=True, pad_token_id=tok.token_to_id("<pad>"),
                      eos_token_id=tok.token_to_id("</s>"), decoder_start_token_id=tok.token_to_id("<pad>"))
    model = T5ForConditionalGeneration(config)
    model.save_pretrained(out)
    tok.save(f"{out}/tokenizer.json")
    with open(f"{out}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 64}, f, indent=1)
    print(f"make_model: T5ForConditionalGeneration ({sum(p.numel() for p in model.parameters()):,} parameters) and a "
          f"Unigram tokenizer.json ({tok.get_vocab_size()} tokens) in {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
