#!/usr/bin/env bash
# Packs what a GPU machine (no Rust toolchain, no network, 64 MiB a call) needs to run
# tools/bench/gpu_run.sh: the CUDA server, xtask (for make-shaped), the model crate's unit
# tests with the `cuda` feature, and a tokenizer source for the shaped files; with --llama
# also llama.cpp's source, trimmed, for tools/bench/build_llama_cuda.sh. Binaries are
# stripped and xz-compressed; the folder (default .gl, which git ignores) goes in `carry`.
# usage: tools/bench/gpu_pack.sh [--llama] [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
llama=0
if [ "${1:-}" = --llama ]; then llama=1; shift; fi
out=${1:-.gl}
mkdir -p "$out"
pack() { strip -o "$out/$2" "$1" && xz -T0 -6 -f "$out/$2"; }

# The commit the binaries are built from, for the run's report.
git describe --always --dirty --abbrev=7 > "$out/commit"
cargo build --release -p mtplx-serve --features cuda
pack target/release/mtplx-serve mtplx-serve
cargo build --release -p xtask
pack target/release/xtask xtask
# The lib test binary (the only executable a `--lib` test build names).
. tools/bench/built.sh
libtest=$(built -p mtplx-model --features cuda --lib | awk '{ print $2 }' | tail -1)
pack "$libtest" libtest
# make-shaped takes the tokenizer of a GGUF file: its smallest shape carries it.
target/release/xtask make-shaped --shape tiny --seed 1 --out "$out/tok.gguf" >/dev/null
xz -T0 -6 -f "$out/tok.gguf"
if [ $llama = 1 ]; then
  sdist=target/peer/llama_cpp_python-0.3.36/vendor/llama.cpp
  [ -d "$sdist" ] || { echo "no $sdist: run cargo xtask peer once to fetch the sdist" >&2; exit 1; }
  # The folders a CUDA build reads (scripts/ too: llama-server's build reads
  # scripts/ui-assets.cmake even with the web UI off), without the other backends.
  tar -C "$sdist" -cJf "$out/llama-src.tar.xz" \
    --exclude='ggml/src/ggml-vulkan' --exclude='ggml/src/ggml-sycl' --exclude='ggml/src/ggml-metal' \
    --exclude='ggml/src/ggml-cann' --exclude='ggml/src/ggml-opencl' --exclude='ggml/src/ggml-musa' \
    --exclude='ggml/src/ggml-hip' --exclude='ggml/src/ggml-webgpu' --exclude='ggml/src/ggml-zdnn' \
    --exclude='ggml/src/ggml-hexagon' --exclude='ggml/src/ggml-openvino' --exclude='ggml/src/ggml-et' \
    --exclude='ggml/src/ggml-virtgpu' --exclude='ggml/src/ggml-zendnn' \
    CMakeLists.txt cmake ggml src include common tools vendor app scripts licenses LICENSE
fi
du -sh "$out"
ls -la "$out"
