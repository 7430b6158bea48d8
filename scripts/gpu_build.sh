#!/usr/bin/env bash
# Build shardtrain on a machine with no network and none of our Debian -dev packages: the GPU machine (CUDA,
# CMake, Ninja and a Python with the pinned torch wheel, nothing else). docs/notes/gpu.md describes the sessions.
#
#   scripts/gpu_build.sh download [DEPS]        on the development machine: the Debian packages the build needs
#                                               (about 4 MB) into DEPS (default .gpu-deps/, git-ignored)
#   scripts/gpu_build.sh [DEPS [BUILD]] [-- TARGET...]
#                                               on the GPU machine: unpack DEPS with dpkg -x into BUILD/deps (no
#                                               root needed, nothing installed system-wide), configure against the
#                                               torch of $PYTHON (default python3) and build with every core
#
# Afterwards run programs with `source BUILD/deps/env.sh` (the unpacked shared libraries on LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libyaml-cpp-dev libyaml-cpp0.7 libstb-dev libstb0 libutf8proc-dev libutf8proc2 nlohmann-json3-dev
          libgloo-dev libgtest-dev libxxhash-dev libonig-dev libonig5 libsentencepiece-dev libsentencepiece0)

if [[ "${1:-}" == download ]]; then
  deps=${2:-.gpu-deps}
  mkdir -p "$deps"
  (cd "$deps" && apt-get download "${packages[@]}")
  du -sh "$deps"
  exit 0
fi

deps=.gpu-deps
build=build-gpu
if [[ $# -gt 0 && "$1" != -- ]]; then deps=$1; shift; fi
if [[ $# -gt 0 && "$1" != -- ]]; then build=$1; shift; fi
[[ "${1:-}" == -- ]] && shift
targets=("$@")

for p in "${packages[@]}"; do
  compgen -G "$deps/${p}_*.deb" >/dev/null || { echo "gpu_build.sh: $deps has no $p package (run: scripts/gpu_build.sh download)" >&2; exit 2; }
done

prefix=$(realpath -m "$build/deps")
mkdir -p "$prefix"
for f in "$deps"/*.deb; do dpkg -x "$f" "$prefix"; done
libdir="$prefix/usr/lib/x86_64-linux-gnu"
echo "export LD_LIBRARY_PATH=\"$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"" >"$prefix/env.sh"

python=$(command -v "${PYTHON:-python3}")
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
echo "gpu_build.sh: torch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)'),"\
     "$(nproc) cores, compiler ${CXX:-$(command -v clang++ || command -v g++)}"

# clang++ when present (as scripts/setup.sh), else g++; precompiled headers either way.
if [[ -z "${CXX:-}" ]] && command -v clang++ >/dev/null; then export CXX=clang++; fi
# Arrow and Parquet files are read with pyarrow's libraries; a Python without pyarrow builds without them.
arrow=ON
"$python" -c 'import pyarrow' 2>/dev/null || { arrow=OFF; echo "gpu_build.sh: no pyarrow: built without Arrow and Parquet files"; }
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr" \
  -DPython3_EXECUTABLE="$python" -DCMAKE_BUILD_RPATH="$libdir" -DSHARDTRAIN_ARROW=$arrow
start=$(date +%s)
cmake --build "$build" -j "$(nproc)" ${targets[@]:+--target "${targets[@]}"}
echo "gpu_build.sh: built in $(( $(date +%s) - start )) s with $(nproc) jobs"
