"""The layers only look down: every #include of the library's own headers, checked against which folder may use which.

    python tests/check_layers.py [ROOT]
    python tests/check_layers.py --self-test   # the check finds what it must, in a tree made for it

The build enforces the layers themselves (a layer's target sees only its own headers and those below); this also
checks the folders inside a layer (fsdp/ may not include ckpt/, data/ may not include models/), names each file
and line that breaks a rule, and which rule. Exits 1 when one does. docs/notes/architecture.md draws the same table.
"""
import os
import re
import sys

# layer -> folder -> the folders it may include besides itself (its own layer's and those below).
RULES = {
    "core": {
        "util": set(),
        "log": set(),
        "cuda": {"parallel"},
        "memory": {"cuda"},
        "parallel": set(),
        "io": set(),
        "distributed": {"cuda", "parallel", "util"},
        "launch": {"util"},
        "nn": {"memory", "parallel"},
        "optim": {"distributed", "io"},
        "fsdp": {"distributed", "io", "memory", "nn", "optim", "parallel"},
        "ddp": {"distributed", "nn", "parallel"},
        "tp": {"distributed", "util"},
        "pp": {"distributed", "parallel", "util"},
        "ckpt": {"distributed", "fsdp", "io", "memory", "optim", "tp", "util"},
    },
    "models": {
        "data": {"io", "util"},
        "models": {"data", "ddp", "distributed", "fsdp", "io", "nn", "optim", "parallel", "pp", "tp", "util"},
    },
    "train": {
        "config": {"io", "launch", "memory", "models", "parallel", "pp", "util"},
        "plan": {"distributed", "fsdp", "io", "memory", "models", "parallel", "pp", "util"},
        "train": None,  # the loop: anything below it
        "hf": {"ckpt", "config", "data", "io", "models", "train", "util"},
        "generate": {"config", "data", "distributed", "io", "models"},
    },
}
# data/'s subjects, and which of the others each may include: file formats and tokenizers stand alone; the
# pipeline (sources, records into samples, the loader) uses both.
DATA_RULES = {"formats": set(), "tokenizers": set(), "pipeline": {"formats", "tokenizers"}}
DATA_INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:shardtrain/)?data/([a-z_]+)/')
ORDER = ["core", "models", "train"]
LAYER_OF = {folder: layer for layer, folders in RULES.items() for folder in folders}
INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:shardtrain/)?([a-z_]+)/')


def problems(root):
    out = []
    for layer in ORDER:
        for part in ("include/shardtrain", "src"):
            base = os.path.join(root, "lib", layer, part)
            if not os.path.isdir(base):
                continue
            for folder in sorted(os.listdir(base)):
                if folder not in RULES[layer]:
                    out.append(f"lib/{layer}/{part}/{folder}: a folder the rules do not know (tests/check_layers.py)")
                    continue
                allowed = RULES[layer][folder]
                for dirpath, _, names in os.walk(os.path.join(base, folder)):
                    for name in sorted(names):
                        if not name.endswith((".h", ".cpp")):
                            continue
                        path = os.path.join(dirpath, name)
                        rel = os.path.relpath(path, root)
                        subject = os.path.relpath(path, os.path.join(base, folder)).split(os.sep)[0]
                        if folder == "data" and subject not in DATA_RULES:
                            out.append(f"{rel}: outside data's subjects ({', '.join(DATA_RULES)})")
                            continue
                        for number, line in enumerate(open(path, encoding="utf-8"), 1):
                            d = DATA_INCLUDE.match(line)
                            if folder == "data" and d and d.group(1) != subject and d.group(1) in DATA_RULES:
                                if d.group(1) not in DATA_RULES[subject]:
                                    may = ", ".join(sorted(DATA_RULES[subject])) or "no other subject"
                                    out.append(f"{rel}:{number}: data/{subject}/ may include {may}; "
                                               f"not data/{d.group(1)}/")
                            m = INCLUDE.match(line)
                            if not m or m.group(1) == folder or m.group(1) not in LAYER_OF:
                                continue
                            used = m.group(1)
                            used_layer = LAYER_OF[used]
                            if ORDER.index(used_layer) > ORDER.index(layer):
                                out.append(f"{rel}:{number}: {folder}/ ({layer}) includes {used}/, which is in "
                                           f"the {used_layer} layer above it: layers only look down")
                            elif allowed is not None and used not in allowed:
                                may = ", ".join(sorted(allowed)) or "nothing else"
                                out.append(f"{rel}:{number}: {folder}/ may include {may}; not {used}/")
    return out


def self_test():
    """A tree with one include up a layer, one across folders it may not, one across data's subjects it may not, and
    two allowed: exactly three found."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            open(os.path.join(root, rel), "w").write(text)
        write("lib/core/src/fsdp/a.cpp", '#include "shardtrain/models/zoo.h"\n#include "shardtrain/nn/intercept.h"\n')
        write("lib/models/src/data/pipeline/b.cpp", '#include "models/recipe_helpers.h"\n'
              '#include "data/formats/tar.h"\n')
        write("lib/models/src/data/formats/c.cpp", '#include "shardtrain/data/pipeline/source.h"\n')
        found = problems(root)
        expected = ["lib/core/src/fsdp/a.cpp:1: fsdp/ (core) includes models/",
                    "lib/models/src/data/pipeline/b.cpp:1: data/ may include io, util; not models/",
                    "lib/models/src/data/formats/c.cpp:1: data/formats/ may include no other subject; not "
                    "data/pipeline/"]
        ok = len(found) == 3 and all(any(f.startswith(e) for f in found) for e in expected)
        print("\n".join(found))
        print("check_layers self-test:", "ok" if ok else "FAILED")
        sys.exit(0 if ok else 1)


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = problems(root)
    for p in found:
        print(p)
    folders = sum(len(f) for f in RULES.values())
    print(f"check_layers: {len(found)} problem(s) in {folders} folders of {len(ORDER)} layers")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
