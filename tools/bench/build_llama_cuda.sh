#!/bin/bash
# Builds llama.cpp's CUDA `llama-server` and `llama-bench` on a GPU machine with no network,
# from the llama.cpp source inside the llama-cpp-python sdist that `cargo xtask peer` uses,
# trimmed and packed where the sdist is (see docs/bench/h200.md, "How the run was made").
# usage: build_llama_cuda.sh SRC.tar.xz [DIR]   (binaries land in DIR/build/bin)
set -euo pipefail
src=$1
dir=${2:-/root/llama}
mkdir -p "$dir" && tar xJf "$src" -C "$dir"
cd "$dir"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > configure.log 2>&1
cmake --build build --config Release --target llama-server llama-bench -j "$(nproc)" > build.log 2>&1
echo "built: $dir/build/bin/llama-server $dir/build/bin/llama-bench"
