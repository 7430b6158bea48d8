#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine, then the build: system packages (apt-get), the pinned wheels in .venv
# (pip), CMake configure and build. Safe to re-run; it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: compilers (clang, and g++ for its C++ library) and build tools, GoogleTest, and gloo's headers
# (the torch wheel ships gloo's compiled code but not its headers, which ProcessGroupGloo.hpp includes;
# docs/notes/gloo-headers.md).
packages=(g++ clang cmake ninja-build ccache tmux libgtest-dev libgmock-dev libgloo-dev nlohmann-json3-dev libyaml-cpp-dev libstb-dev libutf8proc-dev libonig-dev libsentencepiece-dev
          libxxhash-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python environment: the pinned torch wheel gives LibTorch (C++), and PyTorch itself as the outside reference.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c 'import torch, transformers, safetensors, accelerate, matplotlib, sentencepiece, datasets, seqeval, peft, torchao, sys; sys.exit(0 if torch.__version__.startswith("2.11.0") else 1)' 2>/dev/null; then
  echo "setup: installing the pinned wheels (requirements.txt)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements.txt
fi

# The compiler: clang++ where there is one (CXX overrides). With precompiled headers it compiles a file of this
# project in a third of g++'s time, because its precompiled header also holds LibTorch's template instantiations
# (docs/notes/build-times.md); g++ builds the same code. Resolved to a full path, as CMake records it in its cache.
if [ -n "${CXX:-}" ]; then
  wanted=$CXX
  CXX=$(command -v "$wanted") || { echo "setup: CXX=$wanted is not a program on PATH"; exit 1; }
else
  CXX=$(command -v clang++ || command -v g++)
fi
if [ -f build/CMakeCache.txt ] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$CXX" build/CMakeCache.txt; then
  echo "setup: build/ was configured with another compiler; configuring it afresh with $CXX"
  rm -rf build
fi
TORCH_PREFIX=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
echo "setup: configuring build/ with $CXX (LibTorch from $TORCH_PREFIX)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DCMAKE_CXX_COMPILER="$CXX" -DPython3_EXECUTABLE="$PWD/.venv/bin/python" >build-configure.log 2>&1 ||
  { cat build-configure.log; exit 1; }
echo "setup: building"
cmake --build build
echo "setup: done. Run the tests with: scripts/test.sh"
