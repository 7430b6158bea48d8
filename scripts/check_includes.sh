#!/usr/bin/env bash
# Checks that every translation unit compiles from its own #includes. The normal build force-includes a precompiled
# header (LibTorch's C++ frontend) into every file, which hides a missing include; this configures a build without
# precompiled headers in $BUILD (default /tmp/shardtrain-check-includes) and runs the compiler's syntax check on each
# file, $JOBS at a time. About 10 minutes on 2 cores. Prints each failing file's first errors; exits 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-/tmp/shardtrain-check-includes}
JOBS=${JOBS:-$(nproc)}
CXX=${CXX:-$(command -v clang++ || command -v g++)}

TORCH_PREFIX=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DCMAKE_CXX_COMPILER="$CXX" -DPython3_EXECUTABLE="$PWD/.venv/bin/python" -DCMAKE_CXX_COMPILER_LAUNCHER= \
  -DSHARDTRAIN_PRECOMPILED_HEADERS=OFF >"$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }

# One line per file: "cd DIR && COMPILER -fsyntax-only FLAGS FILE" (the object file's -o dropped).
.venv/bin/python - "$BUILD/compile_commands.json" >"$BUILD/syntax_commands" <<'EOF'
import json, shlex, sys
for entry in json.load(open(sys.argv[1])):
    args = shlex.split(entry["command"])
    out = [args[0], "-fsyntax-only"]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        else:
            out.append(a)
    print("cd %s && %s" % (shlex.quote(entry["directory"]), " ".join(shlex.quote(a) for a in out)))
EOF
total=$(wc -l <"$BUILD/syntax_commands")
echo "check_includes: $total files with $CXX, $JOBS at a time"
rm -rf "$BUILD/failed" && mkdir -p "$BUILD/failed"
# Each failing file leaves its errors in failed/<n>; a dot per file shows progress.
nl -ba -w1 -s' ' "$BUILD/syntax_commands" | tr '\n' '\0' |
  xargs -0 -P "$JOBS" -I{} bash -c 'line="$1"; n=${line%% *}; cmd=${line#* };
    if ! out=$(bash -c "$cmd" 2>&1); then printf "%s\n" "$out" | grep -m6 -A2 "error" >"$0/failed/$n"; fi
    printf .' "$BUILD" {}
echo
failed=$(ls "$BUILD/failed" | wc -l)
if [ "$failed" -gt 0 ]; then
  cat "$BUILD"/failed/*
  echo "check_includes: $failed of $total files do not compile from their own includes"
  exit 1
fi
echo "check_includes: all $total files compile from their own includes"
