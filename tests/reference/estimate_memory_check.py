"""`shardtrain estimate-memory` against Accelerate's own arithmetic and table.

For configs of every family at several sizes (the zoo's published flavors and odd custom sizes), written as
config.json files: Accelerate's estimate — transformers' AutoModel built on the meta device from the config,
accelerate.utils.calculate_maximum_sizes, estimate_training_usage, convert_bytes and create_ascii_table, as
`accelerate estimate-memory` uses them — must equal, character for character, the table shardtrain prints for the
same file. Then a zoo flavor's table must equal its config.json's (same numbers, the flavor as the title), the
seed's bert-base-cased numbers must be there, and bad input must fail with a message naming it.

The model is built under torch.device("meta") rather than accelerate.init_empty_weights: with transformers 5,
init_empty_weights leaves T5Model's encoder/decoder embed_tokens untied from `shared` (three copies of the
embedding); on the meta device they are tied, as in the real model.

usage: estimate_memory_check.py SHARDTRAIN_BIN
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from accelerate.commands.estimate import create_ascii_table, estimate_training_usage
from accelerate.utils import calculate_maximum_sizes, convert_bytes
from transformers import (AutoModel, BertConfig, FlavaConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config,
                          Qwen3Config, T5Config, ViTConfig)

transformers.logging.set_verbosity_error()

DTYPES = ["float32", "float16", "int8", "int4"]  # the choices of Accelerate's --dtypes


def flava(dim, mlp, heads, unimodal, multimodal, **kw):
    common = dict(hidden_size=dim, intermediate_size=mlp, num_attention_heads=heads)
    return FlavaConfig(image_config=dict(common, num_hidden_layers=unimodal, **kw.get("image", {})),
                       text_config=dict(common, num_hidden_layers=unimodal, **kw.get("text", {})),
                       multimodal_config=dict(common, num_hidden_layers=multimodal),
                       hidden_size=dim, projection_dim=dim)


CONFIGS = {
    "bert-base-cased": BertConfig(vocab_size=28996, architectures=["BertForMaskedLM"]),
    "bert-large-uncased": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                     intermediate_size=4096),
    "bert-odd": BertConfig(vocab_size=777, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=100, max_position_embeddings=33, type_vocab_size=3),
    "vit-base-patch16-224": ViTConfig(architectures=["ViTForImageClassification"],
                                      id2label={i: str(i) for i in range(1000)}),
    "vit-odd": ViTConfig(image_size=40, patch_size=8, hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=50),
    "t5-small": T5Config(),
    "t5-3b": T5Config(d_model=1024, d_kv=128, d_ff=16384, num_layers=24, num_heads=32),
    "t5-odd": T5Config(vocab_size=999, d_model=40, d_kv=8, d_ff=72, num_layers=3, num_heads=5,
                       relative_attention_num_buckets=8),
    "llama-3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                              rope_theta=500000.0),
    "llama-3.2-1b": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "mistral-7b": MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                                sliding_window=4096),
    "qwen2.5-0.5b": Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-0.6b": Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                              max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                              tie_word_embeddings=True),
    "llama-odd": LlamaConfig(vocab_size=1001, hidden_size=96, intermediate_size=200, num_hidden_layers=3,
                             num_attention_heads=6, num_key_value_heads=2),
    "gpt2": GPT2Config(architectures=["GPT2LMHeadModel"]),
    "gpt2-xl": GPT2Config(n_embd=1600, n_layer=48, n_head=25),
    "gpt2-odd": GPT2Config(vocab_size=1003, n_positions=40, n_embd=48, n_layer=3, n_head=6, n_inner=100),
    "flava-350m": flava(768, 3072, 12, 12, 6),
    "flava-odd": flava(64, 96, 4, 2, 1, image=dict(image_size=48, patch_size=16),
                       text=dict(vocab_size=500, max_position_embeddings=40)),
}

# Zoo flavors whose config.json above is the same model: their tables must match but for the title.
SAME_AS_FLAVOR = {"bert-base-cased": "bert-base-cased", "t5-small": "t5-small", "flava-350m": "flava-350m",
                  "llama-3-8b": "llama-3-8b", "llama-3.2-1b": "llama-3.2-1b", "mistral-7b": "mistral-7b",
                  "qwen2.5-0.5b": "qwen2.5-0.5b", "qwen3-0.6b": "qwen3-0.6b",
                  "vit-base-patch16-224": "vit-base-patch16-224", "gpt2": "gpt2", "gpt2-xl": "gpt2-xl"}


def accelerate_table(config, title):
    with torch.device("meta"):
        model = AutoModel.from_config(config, dtype=torch.float32)
    total, largest = calculate_maximum_sizes(model)
    rows = []
    for dtype in DTYPES:  # accelerate.commands.estimate.gather_data and estimate_command
        size, layer = total, largest[0]
        usage = estimate_training_usage(size, dtype)
        div = {"float16": 2, "int8": 4, "int4": 8}.get(dtype)
        if div:
            size, layer = size / div, layer / div
        top = max(usage.values())
        rows.append([dtype, convert_bytes(layer), convert_bytes(size), convert_bytes(top) if top != -1 else "N/A"])
    return create_ascii_table(["dtype", "Largest Layer", "Total Size", "Training using Adam"], rows,
                              f"Memory Usage for loading `{title}`")


def shardtrain(binary, *args):
    return subprocess.run([binary, "estimate-memory", *args], capture_output=True, text=True, timeout=120)


def first_table(text):
    lines = text.splitlines()
    end = next(i for i, l in enumerate(lines) if l.startswith("└"))
    return "\n".join(lines[: end + 1])


def main():
    binary = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in CONFIGS.items():
            directory = os.path.join(tmp, name)
            os.makedirs(directory)
            config.to_json_file(os.path.join(directory, "config.json"))
            want = accelerate_table(config, directory)
            run = shardtrain(binary, directory, "--dtypes", *DTYPES)
            if run.returncode != 0:
                failures.append(f"{name}: exit {run.returncode}: {run.stderr}")
                continue
            got = first_table(run.stdout)
            if got != want:
                failures.append(f"{name}: tables differ\n--- accelerate\n{want}\n--- shardtrain\n{got}")
            else:
                print(f"{name}: same table ({got.splitlines()[5].strip()})")
            if name in SAME_AS_FLAVOR:
                flavor = SAME_AS_FLAVOR[name]
                zoo = shardtrain(binary, flavor, "--dtypes", *DTYPES)
                if zoo.returncode != 0 or first_table(zoo.stdout) != accelerate_table(config, flavor):
                    failures.append(f"{name}: the zoo flavor {flavor} prints another table:\n{zoo.stdout}{zoo.stderr}")

        # The seed's numbers (Accelerate's table for bert-base-cased, and its training stages).
        seed = shardtrain(binary, "bert-base-cased").stdout
        for number in ["413.18 MB", "1.61 GB", "619.77 MB", "826.36 MB", "206.59 MB"]:
            if number not in seed:
                failures.append(f"bert-base-cased: {number} missing from\n{seed}")

        # Bad input: each names the offending value.
        bad = os.path.join(tmp, "bad")
        os.makedirs(bad)
        cases = [
            ({"model_type": "gpt_neox"}, "gpt_neox"),
            ({"model_type": "gpt2", "activation_function": "gelu_fast"}, "gelu_fast"),
            ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 8.0}}, "yarn"),
            ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
             "'low_freq_factor' is absent"),
            ({"model_type": "t5", "feed_forward_proj": "gated-gelu"}, "gated-gelu"),
            ({"model_type": "bert", "hidden_size": "big"}, "hidden_size"),
        ]
        for i, (content, expected) in enumerate(cases):
            path = os.path.join(bad, f"{i}.json")
            with open(path, "w") as f:
                json.dump(content, f)
            run = shardtrain(binary, path)
            if run.returncode == 0 or expected not in run.stderr:
                failures.append(f"{content}: expected an error naming '{expected}', got {run.returncode}: "
                                f"{run.stderr}")
        for args, expected in [(["no-such-flavor"], "no-such-flavor"), ([os.path.join(tmp, "missing")], "missing"),
                               (["bert-debug", "--dtypes", "float64"], "float64"),
                               # job flags are the trainer's config keys: their errors name the key
                               (["llama-debug", "--num-processes", "3", "--nnodes", "2"],
                                "launch.num_processes: 3 is not a multiple of launch.num_machines (2)"),
                               (["llama-debug", "--strategy", "zero3"], "zero3"),
                               (["llama-debug", "--batch-size", "0"], "train.batch_size: '0' is not at least 1"),
                               (["llama-debug", "--mixed-precision", "fp8"], "fp8"),
                               (["vit-huge-patch14-224", "--batch-size", "2"], "no classifier")]:
            run = shardtrain(binary, *args)
            if run.returncode == 0 or expected not in run.stderr:
                failures.append(f"{args}: expected an error naming '{expected}', got {run.returncode}: {run.stderr}")

        # The training estimate: a job's table and JSON, with the terms adding up to the peak.
        run = shardtrain(binary, "llama-debug", "--num-processes", "4", "--batch-size", "2", "--json")
        estimate = json.loads(run.stdout) if run.returncode == 0 else None
        if not estimate or sum(t["bytes"] for t in estimate["terms"]) != estimate["peak_bytes"]:
            failures.append(f"llama-debug --json: terms do not add up to the peak: {run.stdout}{run.stderr}")

        # `shardtrain plan`: its training flags are the trainer's keys (--seq-len data.max_text_length, --lora
        # model.lora.r), and the recommended config carries them.
        run = subprocess.run([binary, "plan", "llama-debug", "--gpus", "2", "--gpu-memory", "1GiB", "--seq-len", "64",
                              "--lora", "4", "--top", "1"], capture_output=True, text=True, timeout=120)
        if run.returncode != 0 or "64 text tokens" not in run.stdout or "\n    r: 4\n" not in run.stdout:
            failures.append(f"plan --seq-len 64 --lora 4: {run.returncode}: {run.stdout}{run.stderr}")
        # A GPU preset and a global batch: the plan says what it assumed, and each row trains that batch.
        run = subprocess.run([binary, "plan", "llama-debug", "--gpus", "4", "--gpu", "h100", "--seq-len", "64",
                              "--global-batch", "8", "--top", "3", "--json"], capture_output=True, text=True,
                             timeout=120)
        rows = json.loads(run.stdout) if run.returncode == 0 else []
        if not rows or any(r["batch"] * r.get("grad_accum", 1) * 4 // (r["tp_size"] * r["pp_size"]) != 8
                           for r in rows):
            failures.append(f"plan --gpu h100 --global-batch 8: {run.returncode}: {run.stdout}{run.stderr}")
        # Tokens a step over the length the plan trains at (t5-small's 512 without --seq-len, not the 8192 cap).
        run = subprocess.run([binary, "plan", "t5-small", "--gpus", "8", "--gpu", "h100",
                              "--global-batch-tokens", "4096", "--top", "3", "--json"], capture_output=True, text=True,
                             timeout=120)
        rows = json.loads(run.stdout) if run.returncode == 0 else []
        if not rows or any(r["batch"] * r["grad_accum"] * 8 // (r["tp_size"] * r["pp_size"]) != 8 for r in rows):
            failures.append(f"plan t5-small --global-batch-tokens 4096: {run.returncode}: {run.stdout}{run.stderr}")
        # The T5 post's scale claims (plan --figure t5-scale): its 81B needs activation and parameter offload, and
        # activation offload buys batch at every size it fits.
        run = subprocess.run([binary, "plan", "--figure", "t5-scale", "--json"], capture_output=True, text=True,
                             timeout=120)
        figure = json.loads(run.stdout) if run.returncode == 0 else {}
        both, params = "FSDP + AC + activation and parameter offload", "FSDP + AC + parameter offload"
        rows = figure.get("rows", [])
        if (not rows or figure["largest"][both] < 80e9
                or not any(f["agrees"] and f["finding"].startswith("81B") for f in figure["findings"])
                or any(r[both] < r[params] for r in rows)):
            failures.append(f"plan --figure t5-scale: {run.returncode}: {run.stdout[-2000:]}{run.stderr}")
        # estimate-memory --activation-offload: the layers' activations in host memory, the device's peak lower.
        def estimate(*extra):
            run = subprocess.run([binary, "estimate-memory", "llama-debug", "--num-processes", "2", "--batch-size",
                                  "4", "--seq-len", "512", "--json", *extra], capture_output=True, text=True,
                                 timeout=120)
            return json.loads(run.stdout) if run.returncode == 0 else {}
        plain, offloaded = estimate(), estimate("--activation-offload")
        if not plain or not offloaded or not (offloaded["host_bytes"] > 0 == plain["host_bytes"]
                                              and offloaded["peak_bytes"] < plain["peak_bytes"]):
            failures.append(f"estimate-memory --activation-offload: {plain} {offloaded}")
        # `shardtrain plan`: bad input names itself.
        for args, expected in [(["llama-debug", "--gpus", "8", "--gpu-memory", "40XB"], "40XB"),
                               (["llama-debug", "--gpus", "8", "--gpu-memory", "80"], "'80' has no unit"),
                               (["llama-debug", "--gpu-memory", "40GiB"], "--gpus"),
                               (["llama-debug", "--gpus", "8", "--gpu", "v100"], "'v100'"),
                               (["llama-debug", "--gpus", "8", "--gpu", "h100", "--global-batch-tokens", "100"],
                                "not a multiple"),
                               (["llama-debug", "--gpus", "6", "--nodes", "4", "--gpu-memory", "8GiB"], "4 nodes"),
                               (["--figure", "gpt"], "gpt")]:
            run = subprocess.run([binary, "plan", *args], capture_output=True, text=True, timeout=120)
            if run.returncode == 0 or expected not in run.stderr:
                failures.append(f"plan {args}: expected an error naming '{expected}', got {run.returncode}: "
                                f"{run.stderr}")

    for f in failures:
        print("FAIL", f)
    print(f"{len(CONFIGS)} configs, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
