"""Reference outputs from Hugging Face transformers for the zoo's debug flavors and parameter counts of the published
flavors. For each family: a model built by transformers from the flavor's configuration with seeded random weights,
its weights saved as safetensors (Hugging Face names), a batch and the model's outputs on it (eval mode, float32).
tests/models/hf_parity_test.cpp loads the weights into shardtrain's model and compares.

The same weights are also saved as torch.save wrote them before safetensors (OUT_DIR/<family>/torch/: the
pytorch_model.bin files that many checkpoints on the Hub still hold), for the tests that read those files, and for
bert and t5 as an FSDP2 job's distributed checkpoint (OUT_DIR/<family>/dcp/; damaged copies in bert/dcp-faults/).

usage: hf_reference.py OUT_DIR
The generating families' io.safetensors also hold greedy generation from left-padded prompts (gen_*), and
OUT_DIR/generation/scores.safetensors the logits processors' outputs on random scores.

writes OUT_DIR/<family>/{model.safetensors, io.safetensors, torch*/...}, OUT_DIR/generation/scores.safetensors and
OUT_DIR/counts.json
"""
import copy
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from dcp_reference import save_compiled_names, save_dcp, write_faults
import transformers
from transformers import (BertConfig, BertForPreTraining, FlavaConfig, FlavaForPreTraining, GPT2Config,
                          GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, T5Config,
                          T5ForConditionalGeneration, ViTConfig, ViTForImageClassification, ViTModel)

transformers.logging.set_verbosity_error()


# The debug flavors of shardtrain's flavor tables, as transformers configurations.
def bert_debug():
    return BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)


def vit_debug():
    return ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, num_labels=10)


def llama_debug():
    return LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


def llama3_debug(attention_bias=True):
    """shardtrain's llama-3.2-debug, Llama 3.2's shape at debug size: "llama3" RoPE scaling (original context 64: of
    the 16 frequencies of a 32-wide head, the two fastest kept, one interpolated, the rest scaled), head_dim 32 !=
    64 / 4, the head tied to the embedding; for the parity test also biases on q, k, v and o (attention_bias)."""
    return LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       attention_bias=attention_bias,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64})


def mistral_debug():
    """shardtrain's mistral-debug: a sliding window of 8 positions."""
    return MistralConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=8, tie_word_embeddings=False)


def qwen2_debug():
    """shardtrain's qwen2-debug: biases on q, k and v, the head tied to the embedding."""
    return Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)


def qwen3_debug():
    """shardtrain's qwen3-debug: q_norm and k_norm, heads of 32 (not 64 / 4), the head tied to the embedding."""
    return Qwen3Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)


def gpt2_debug():
    """shardtrain's gpt2-debug: n_inner null (4 * n_embd), gelu_new, the head tied to wte."""
    return GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4)


def t5_debug():
    return T5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=16,
                    feed_forward_proj="relu", tie_word_embeddings=True,
                    decoder_start_token_id=0, pad_token_id=0)


def flava_config(dim, mlp, heads, unimodal, multimodal, image=224, patch=16, vocab=30522, positions=512,
                 codebook_hidden=256, codebook_blocks=2, visual_vocab=8192):
    common = dict(hidden_size=dim, intermediate_size=mlp, num_attention_heads=heads)
    return FlavaConfig(
        image_config=dict(common, num_hidden_layers=unimodal, image_size=image, patch_size=patch,
                          vocab_size=visual_vocab),
        text_config=dict(common, num_hidden_layers=unimodal, vocab_size=vocab, max_position_embeddings=positions),
        multimodal_config=dict(common, num_hidden_layers=multimodal),
        image_codebook_config=dict(hidden_size=codebook_hidden, num_blocks_per_group=codebook_blocks,
                                   vocab_size=visual_vocab),
        hidden_size=dim, projection_dim=dim)


def flava_debug():
    return flava_config(32, 64, 4, 2, 1, image=32, patch=8, vocab=1000, positions=64, codebook_hidden=16,
                        codebook_blocks=1, visual_vocab=64)


def randomize(model, seed):
    """Every parameter random (transformers zero-initialises biases, cls tokens, ...: too easy to match)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        if hasattr(model, "flava"):
            model.flava.logit_scale.fill_(2.6592)


def save(out, family, model, io):
    d = os.path.join(out, family)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    save_file({k: v.contiguous() for k, v in io.items() if v is not None}, os.path.join(d, "io.safetensors"))
    save_torch(d, family, model)


def save_torch(d, family, model):
    """The weights as torch.save files in d/torch*/ (transformers 5 writes safetensors only): the whole state_dict
    (an OrderedDict with its _metadata attribute, tied tensors under each name) as transformers before 4.18 saved it;
    for vit the parameters themselves (nn.Parameter); for bert and t5 also plain-dict shards with an index, as
    transformers 4.18-4.x saved them; for bert also in bfloat16 with pickle protocol 4, and in the format of PyTorch
    before 1.6 (many older checkpoints on the Hub)."""
    def directory(name):
        path = os.path.join(d, name)
        os.makedirs(path, exist_ok=True)
        shutil.copy(os.path.join(d, "config.json"), path)
        return path
    state = model.state_dict()
    if family == "vit":  # transformers 5 names ViT's modules apart from its checkpoints: the file's names
        state = {k: torch.nn.Parameter(v) for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    torch.save(state, os.path.join(directory("torch"), "pytorch_model.bin"))
    if family in ("bert", "t5"):
        names = list(model.state_dict().keys())
        shards = [names[i::3] for i in range(3)]
        sharded = directory("torch-sharded")
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
            torch.save({n: state[n] for n in shard}, os.path.join(sharded, file))
            weight_map.update({n: file for n in shard})
        with open(os.path.join(sharded, "pytorch_model.bin.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    if family == "bert":
        torch.save({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()},
                   os.path.join(directory("torch-bf16"), "pytorch_model.bin"), pickle_protocol=4)
        torch.save(state, os.path.join(directory("torch-legacy"), "pytorch_model.bin"),
                   _use_new_zipfile_serialization=False)
    # Distributed checkpoints an FSDP2 job wrote (tests/reference/dcp_reference.py).
    if family == "bert":
        save_dcp(d, os.path.join(d, "dcp"), "BertForPreTraining", world=3, nested=True)
        write_faults(os.path.join(d, "dcp"), os.path.join(d, "dcp-faults"))
        save_compiled_names(d, os.path.join(d, "dcp-compiled"))
        # What Accelerate's save_state writes for an FSDP model: a distributed checkpoint in pytorch_model_fsdp_0/
        # (SHARDED_STATE_DICT), or the whole state dict in pytorch_model_fsdp.bin (FULL_STATE_DICT).
        save_dcp(d, os.path.join(d, "accelerate-sharded"), "BertForPreTraining", world=2, nested=True,
                 accelerate=True)
        torch.save(state, os.path.join(directory("accelerate-full"), "pytorch_model_fsdp.bin"))
    if family == "t5":
        save_dcp(d, os.path.join(d, "dcp"), "T5ForConditionalGeneration", world=2, nested=False, dim1=True)


def text_batch(g, vocab, batch=3, length=12):
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 8:] = 0  # a padded sample
    return ids, mask


def greedy_generation(model, g, encoder_decoder=False):
    """Three left-padded prompts (10, 4 and 7 tokens) continued greedily for at most 10 tokens by transformers'
    generate (a KV cache), first with no end-of-sequence token, then with the token row 0 made 4th as one: row 0
    stops there and is padded (pad 0) while the others go on. Then beam search (3 beams) with the token it makes 4th
    in row 0 as the end token: with transformers' defaults (length_penalty 1, early_stopping False), and with
    early_stopping "never" and length_penalty 2; each row's best hypothesis and its generated length (past it
    transformers fills with the end token)."""
    lengths = [10, 4, 7]
    width = max(lengths)
    mask = torch.zeros(3, width, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, width - n:] = 1
    ids = torch.randint(3, 1000, (3, width), generator=g).masked_fill(mask == 0, 0)
    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, pad_token_id=0, bos_token_id=None, do_sample=False, max_new_tokens=10,
                  max_length=None)
    first = 1 if encoder_decoder else width  # the output repeats the prompt, or begins with the start token

    def run():
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, generation_config=config)[:, first:]
    free = run()
    config.eos_token_id = int(free[0, 3])
    stopped = run()
    out = dict(gen_prompt_ids=ids, gen_prompt_mask=mask, gen_free=free, gen_eos=torch.tensor([config.eos_token_id]),
               gen_stopped=stopped)
    def beams(penalty, early):
        config.update(num_beams=3, length_penalty=penalty, early_stopping=early, return_dict_in_generate=True)
        with torch.no_grad():
            o = model.generate(ids, attention_mask=mask, generation_config=config)
        return o.sequences[:, first:], (o.beam_indices != -1).sum(1)
    config.eos_token_id = None
    config.eos_token_id = int(beams(1.0, False)[0][0, 3])  # the token beam search makes 4th in row 0 ends beams
    out["gen_beam_eos"] = torch.tensor([config.eos_token_id])
    for name, penalty, early in (("gen_beam", 1.0, False), ("gen_beam_never", 2.0, "never")):
        out[name], out[name + "_lengths"] = beams(penalty, early)
    return out


def scores_reference(out, g):
    """transformers' logits processors on random scores (4, 50) after sequences (4, 6): the repetition penalty alone
    (what greedy decoding applies), and the sampling chain: penalty, temperature, top-k, top-p."""
    from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    scores = torch.randn(4, 50, generator=g) * 3
    sequences = torch.randint(0, 50, (4, 6), generator=g)
    penalty = RepetitionPenaltyLogitsProcessor(1.3)
    chain = [penalty, TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)]
    sampled = scores.clone()
    for p in chain:
        sampled = p(sequences, sampled)
    top_p_only = TopPLogitsWarper(0.5)(sequences, scores.clone())
    d = os.path.join(out, "generation")
    os.makedirs(d, exist_ok=True)
    tensors = dict(scores=scores, sequences=sequences, penalized=penalty(sequences, scores.clone()), sampled=sampled,
                   top_p_only=top_p_only)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "scores.safetensors"))


def bert(out, g):
    model = BertForPreTraining(bert_debug()).eval()
    randomize(model, 1)
    ids, mask = text_batch(g, 1000)
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    labels[0, 7] = ids[0, 7]
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        base = model.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
        loss = torch.nn.functional.cross_entropy(o.prediction_logits.view(-1, 1000), labels.view(-1))
    save(out, "bert", model, dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels,
                                  hidden=base.last_hidden_state, pooled=base.pooler_output,
                                  logits=o.prediction_logits, loss=loss))


def vit(out, g):
    model = ViTForImageClassification(vit_debug()).eval()
    randomize(model, 2)
    pixels = torch.randn(3, 3, 32, 32, generator=g)
    labels = torch.tensor([1, 7, 3])
    with torch.no_grad():
        o = model(pixel_values=pixels, labels=labels)
        hidden = model.vit(pixel_values=pixels).last_hidden_state
    save(out, "vit", model, dict(pixels=pixels, labels=labels, hidden=hidden, logits=o.logits, loss=o.loss))


def llama(out, g):
    model = LlamaForCausalLM(llama_debug()).eval()
    randomize(model, 3)
    ids, mask = text_batch(g, 1000)
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, labels=labels)
    save(out, "llama", model, dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss,
                                   **greedy_generation(model, g)))


def llama3(out, g):
    model = LlamaForCausalLM(llama3_debug()).eval()
    randomize(model, 6)
    ids, mask = text_batch(g, 1000, length=48)  # positions far enough for the scaled frequencies to turn
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, labels=labels)
    save(out, "llama3", model, dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss,
                                    **greedy_generation(model, g)))


def decoder(name, model_class, config):
    """A Llama-like decoder's batch of 48 positions (past mistral-debug's window of 8), its logits and loss."""
    def make(out, g):
        model = model_class(config).eval()
        randomize(model, 7)
        ids, mask = text_batch(g, 1000, length=48)
        labels = ids.masked_fill(mask == 0, -100)
        with torch.no_grad():
            o = model(input_ids=ids, attention_mask=mask, labels=labels)
        save(out, name, model, dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss,
                                    **greedy_generation(model, g)))
    return make


def gpt2(out, g):
    """GPT2LMHeadModel's logits and loss, and the loss's gradients of a Conv1D weight of each kind (c_attn, the MLP's
    c_proj) and of the tied table (its lookups' rows and the head's product). Also the weights as the Hub's
    openai-community/gpt2 keeps them (OUT_DIR/gpt2/hub/): GPT2Model's names (no "transformer."), each layer's causal
    mask saved as attn.bias (and masked_bias), no lm_head."""
    model = GPT2LMHeadModel(gpt2_debug()).eval()
    randomize(model, 8)
    ids, mask = text_batch(g, 1000, length=48)
    labels = ids.masked_fill(mask == 0, -100)
    o = model(input_ids=ids, attention_mask=mask, labels=labels)
    o.loss.backward()
    h = model.transformer.h
    io = dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits.detach(), loss=o.loss.detach(),
              grad_c_attn=h[0].attn.c_attn.weight.grad, grad_mlp_c_proj=h[1].mlp.c_proj.weight.grad,
              grad_wte=model.transformer.wte.weight.grad, **greedy_generation(model, g))
    save(out, "gpt2", model, io)
    hub = os.path.join(out, "gpt2", "hub")
    os.makedirs(hub, exist_ok=True)
    shutil.copy(os.path.join(out, "gpt2", "config.json"), hub)
    state = {k: v.detach().contiguous() for k, v in model.transformer.state_dict().items()}
    n = model.config.n_positions
    for i in range(model.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(state, os.path.join(hub, "model.safetensors"))


def t5(out, g):
    model = T5ForConditionalGeneration(t5_debug()).eval()
    randomize(model, 4)
    ids, mask = text_batch(g, 1000, length=20)  # 20 > max_distance 16: the logarithmic buckets are used
    labels = torch.randint(0, 1000, (3, 18), generator=g)
    labels[2, 15:] = -100
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, labels=labels)
    save(out, "t5", model, dict(input_ids=ids, attention_mask=mask, labels=labels, logits=o.logits, loss=o.loss,
                                encoder_hidden=o.encoder_last_hidden_state,
                                **greedy_generation(model, g, encoder_decoder=True)))


def flava(out, g):
    model = FlavaForPreTraining(flava_debug()).eval()
    randomize(model, 5)
    b = 4
    ids, mask = text_batch(g, 1000, batch=b)
    masked_ids = ids.clone()
    mlm_labels = torch.full_like(ids, -100)
    for i, j in [(0, 2), (1, 4), (2, 1), (3, 5), (0, 9)]:
        mlm_labels[i, j] = ids[i, j]
        masked_ids[i, j] = 103
    pixels = torch.randn(b, 3, 32, 32, generator=g)
    codebook_pixels = torch.rand(b, 3, 32, 32, generator=g)
    masked_patches = torch.rand(b, 16, generator=g) < 0.4
    masked_patches[:, 0] = True
    itm_labels = torch.tensor([1, 0, 1, 1])
    io = dict(input_ids=ids, input_ids_masked=masked_ids, attention_mask=mask, pixels=pixels,
              codebook_pixels=codebook_pixels, masked_patches=masked_patches, mlm_labels=mlm_labels,
              itm_labels=itm_labels)
    with torch.no_grad():
        mm = model(input_ids=ids, input_ids_masked=masked_ids, attention_mask=mask, pixel_values=pixels,
                   codebook_pixel_values=codebook_pixels, bool_masked_pos=masked_patches, mlm_labels=mlm_labels,
                   itm_labels=itm_labels, return_loss=True)
        text_only = model(input_ids=ids, input_ids_masked=masked_ids, attention_mask=mask, mlm_labels=mlm_labels,
                          return_loss=True)
        image_only = model(pixel_values=pixels, codebook_pixel_values=codebook_pixels, bool_masked_pos=masked_patches,
                           return_loss=True)
        tokens = model.image_codebook.get_codebook_indices(codebook_pixels).flatten(1)
    li = mm.loss_info
    io.update(mm_loss=mm.loss, mm_itm=li.itm, mm_gc=li.global_contrastive, mm_mmm_image=li.mmm_image,
              mm_mmm_text=li.mmm_text, mm_itm_logits=mm.itm_logits, mm_logits_per_image=mm.contrastive_logits_per_image,
              text_loss=text_only.loss, text_mlm=text_only.loss_info.mlm, image_loss=image_only.loss,
              image_mim=image_only.loss_info.mim, codebook_tokens=tokens)
    save(out, "flava", model, io)


def llama3_rope(factor):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


def counts():
    """Parameter counts of every published flavor, from transformers' own modules built on the meta device."""
    hf = {
        "bert-base-uncased": lambda: transformers.BertModel(BertConfig()),
        "bert-base-cased": lambda: transformers.BertModel(BertConfig(vocab_size=28996)),
        "bert-large-uncased": lambda: transformers.BertModel(BertConfig(hidden_size=1024, num_hidden_layers=24,
                                                                        num_attention_heads=16,
                                                                        intermediate_size=4096)),
        "vit-base-patch16-224": lambda: ViTForImageClassification(ViTConfig(num_labels=1000)),
        "vit-large-patch16-224": lambda: ViTForImageClassification(ViTConfig(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, num_labels=1000)),
        "vit-huge-patch14-224": lambda: ViTModel(ViTConfig(hidden_size=1280, num_hidden_layers=32,
                                                           num_attention_heads=16, intermediate_size=5120,
                                                           patch_size=14)),
        "t5-small": lambda: T5ForConditionalGeneration(T5Config(feed_forward_proj="relu")),
        "t5-base": lambda: T5ForConditionalGeneration(T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12)),
        "t5-large": lambda: T5ForConditionalGeneration(T5Config(d_model=1024, d_ff=4096, num_layers=24, num_heads=16)),
        "t5-3b": lambda: T5ForConditionalGeneration(T5Config(d_model=1024, d_kv=128, d_ff=16384, num_layers=24,
                                                             num_heads=32)),
        "t5-11b": lambda: T5ForConditionalGeneration(T5Config(d_model=1024, d_kv=128, d_ff=65536, num_layers=24,
                                                              num_heads=128)),
        "llama-2-7b": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=4096,
                                                           intermediate_size=11008, num_hidden_layers=32,
                                                           num_attention_heads=32, num_key_value_heads=32)),
        "llama-3-8b": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=128256, hidden_size=4096,
                                                           intermediate_size=14336, num_hidden_layers=32,
                                                           num_attention_heads=32, num_key_value_heads=8)),
        "llama-3.1-8b": lambda: LlamaForCausalLM(LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, max_position_embeddings=131072, rope_scaling=llama3_rope(8.0))),
        "llama-3.2-1b": lambda: LlamaForCausalLM(LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rope_scaling=llama3_rope(32.0),
            tie_word_embeddings=True)),
        "llama-3.2-3b": lambda: LlamaForCausalLM(LlamaConfig(
            vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
            num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, rope_scaling=llama3_rope(32.0),
            tie_word_embeddings=True)),
        "mistral-7b": lambda: MistralForCausalLM(MistralConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, max_position_embeddings=32768, sliding_window=4096)),
        "mistral-7b-v0.3": lambda: MistralForCausalLM(MistralConfig(
            vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, max_position_embeddings=32768, sliding_window=None, rope_theta=1e6)),
        "qwen2.5-0.5b": lambda: Qwen2ForCausalLM(Qwen2Config(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True)),
        "qwen2.5-7b": lambda: Qwen2ForCausalLM(Qwen2Config(
            vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, max_position_embeddings=131072, tie_word_embeddings=False)),
        "qwen3-0.6b": lambda: Qwen3ForCausalLM(Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True)),
        "qwen3-8b": lambda: Qwen3ForCausalLM(Qwen3Config(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=False)),
        "qwen3-debug": lambda: Qwen3ForCausalLM(qwen3_debug()),
        "mistral-debug": lambda: MistralForCausalLM(mistral_debug()),
        "qwen2-debug": lambda: Qwen2ForCausalLM(qwen2_debug()),
        "llama-3-70b": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=128256, hidden_size=8192,
                                                            intermediate_size=28672, num_hidden_layers=80,
                                                            num_attention_heads=64, num_key_value_heads=8)),
        "flava-350m": lambda: FlavaForPreTraining(flava_config(768, 3072, 12, 12, 6)),
        "flava-900m": lambda: FlavaForPreTraining(flava_config(1024, 4096, 16, 24, 12)),
        "flava-1.8b": lambda: FlavaForPreTraining(flava_config(1280, 5120, 16, 32, 16)),
        "flava-2.7b": lambda: FlavaForPreTraining(flava_config(1408, 6144, 16, 40, 20)),
        "flava-4.8b": lambda: FlavaForPreTraining(flava_config(1664, 8192, 16, 48, 24)),
        "flava-10b": lambda: FlavaForPreTraining(flava_config(2048, 10240, 16, 64, 40)),
        "bert-debug": lambda: BertForPreTraining(bert_debug()),
        "vit-debug": lambda: ViTForImageClassification(vit_debug()),
        "t5-debug": lambda: T5ForConditionalGeneration(t5_debug()),
        "llama-debug": lambda: LlamaForCausalLM(llama_debug()),
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config()),
        "gpt2-medium": lambda: GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)),
        "gpt2-large": lambda: GPT2LMHeadModel(GPT2Config(n_embd=1280, n_layer=36, n_head=20)),
        "gpt2-xl": lambda: GPT2LMHeadModel(GPT2Config(n_embd=1600, n_layer=48, n_head=25)),
        "distilgpt2": lambda: GPT2LMHeadModel(GPT2Config(n_layer=6)),
        "gpt2-debug": lambda: GPT2LMHeadModel(gpt2_debug()),
        "llama-3.2-debug": lambda: LlamaForCausalLM(llama3_debug(attention_bias=False)),
        "flava-debug": lambda: FlavaForPreTraining(flava_debug()),
    }
    result = {}
    for name, make in hf.items():
        with torch.device("meta"):
            model = make()
        n = sum(p.numel() for p in model.parameters())  # parameters() yields tied tensors once
        if name == "bert-debug":  # shardtrain has no next-sentence head
            n -= sum(p.numel() for p in model.cls.seq_relationship.parameters())
        result[name] = n
    return result


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    for make in (bert, vit, llama, llama3, decoder("mistral", MistralForCausalLM, mistral_debug()),
                 decoder("qwen2", Qwen2ForCausalLM, qwen2_debug()), decoder("qwen3", Qwen3ForCausalLM, qwen3_debug()),
                 gpt2, t5, flava, scores_reference):
        make(out, g)
    with open(os.path.join(out, "counts.json"), "w") as f:
        json.dump(counts(), f, indent=1)
    print("hf_reference: wrote", out)


if __name__ == "__main__":
    main()
