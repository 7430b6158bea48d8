#!/usr/bin/env bash
# The library as a C++ user gets it: `cmake --install` into a fresh prefix, then examples/cmake_consumer — a CMake
# project of its own that finds the package (find_package(shardtrain CONFIG REQUIRED)) and links shardtrain::core —
# configured, built and run on 2 ranks through the launcher: 10 steps of examples/custom_model.cpp and its
# checkpoint. Then the installed libshardtrain_cuda.so loads LibTorch's CUDA part.
# usage: consume.sh BUILD_DIR SOURCE_DIR SHARDTRAIN_BIN PYTHON CXX
set -euo pipefail
build=$1 src=$2 bin=$3 python=$4 cxx=$5
work=$(mktemp -d /tmp/shardtrain-consume-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
echo "installed: $(find "$work/prefix/include" -name '*.h' | wc -l) headers, $(ls "$work/prefix/lib"/*.a | wc -l) libraries"
test -f "$work/prefix/lib/cmake/shardtrain/shardtrainConfig.cmake"
torch=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
# Through ccache when there is one, the fresh prefix's path not part of a file's identity (CCACHE_BASEDIR): the same
# installed headers and example compile from the cache on the next run; any change to them compiles again.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache)")
  export CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=1
fi
cmake -S "$src/examples/cmake_consumer" -B "$work/build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$work/prefix;$torch" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
"$bin" launch --nproc-per-node 2 -- "$work/build/custom_model" "$work/ckpt" 10 | tee "$work/run.log"
grep -q '^\[rank0\]: step 10 loss' "$work/run.log"
test -f "$work/ckpt/step-00000010/manifest.json"
# LibTorch's CUDA part is not linked into the program (it loads on demand), and the installed libshardtrain_cuda.so
# finds it from where it was installed.
if readelf -d "$work/build/custom_model" | grep -q 'libtorch_cuda'; then
  echo "custom_model links libtorch_cuda: shardtrain::core should link LibTorch's CPU part alone"; exit 1
fi
SHARDTRAIN_CUDA_LIBRARY="$work/prefix/lib/libshardtrain_cuda.so" "$bin" env >"$work/env.log"
grep -q '^CUDA: runtime' "$work/env.log" || { cat "$work/env.log"; exit 1; }
echo "the installed package built and ran examples/custom_model.cpp on 2 ranks; its CUDA library loads"
