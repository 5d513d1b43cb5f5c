#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over what tools/bench/gpu_pack.sh
# packed into DIR (default .gl): the device and its copy bandwidth, the CUDA unit tests, the
# Llama-3-8B-shaped files written there (make-shaped), and each file through mtplx's server
# (tools/bench/gpu_server.py, plain decoding) for each kernel source in KERNELS (`builtin`,
# or NAME for DIR/k-NAME.cu through MTPLX_CUDA_KERNELS: the same binary times both in one
# run; each source's unit tests first, and only the sources that pass them are timed;
# SOURCE@WEIGHTS runs the server with MTPLX_WEIGHTS=WEIGHTS, e.g. builtin@native for a
# K-quant file's products with f32 activations; SOURCE[@WEIGHTS]/KV with MTPLX_KV_DTYPE=KV,
# e.g. builtin/f32 for K/V stored in f32 on the device);
# with LLAMA=1 llama.cpp's CUDA server too, built there from DIR/llama-src.tar.xz; with
# RETURNING=1 the returning conversation (gpu_server.py's "returning" part) for the first
# source too.
# Results: $OUT/gpu-run.tgz (JSON and server logs) and the printed lines.
# Knobs: FILES (q4_k_m q4_0), KERNELS (builtin), SIZES (100,400), ROUNDS (2), GEN (64),
# DEVICE (cuda; cpu tries the script on a machine without a GPU with SHAPE=tiny).
set -uo pipefail
G=$(realpath "${1:-.gl}")
OUT=${OUT:-/tmp/gpu-out}
W=/tmp/gpu-run
mkdir -p "$OUT" "$W/res"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
(cd "$G" && for f in *.xz; do [ "$f" = llama-src.tar.xz ] || xz -dkf -T0 "$f"; done; chmod +x mtplx-serve xtask libtest)
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 - <<'PY'
import torch, time
x = torch.empty(2**31, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.time()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); dt = (time.time() - t) / 10
print(f"device copy bandwidth (read + write): {2 * x.numel() / dt / 1e12:.2f} TB/s")
PY
fi
# llama.cpp builds (about 5 minutes) while the unit tests run and the files are written.
if [ "${LLAMA:-0}" = 1 ]; then
  bash tools/bench/build_llama_cuda.sh "$G/llama-src.tar.xz" "$W/llama" &
  llama_build=$!
fi
# The unit tests for each kernel source: a source that fails them is not timed.
KERNELS=${KERNELS:-builtin}
use_source() {
  local spec=${1%%/*} kv=
  [ "$1" != "$spec" ] && kv=${1#*/}
  local src=${spec%@*}
  if [ "$src" = builtin ]; then unset MTPLX_CUDA_KERNELS; else export MTPLX_CUDA_KERNELS=$G/k-$src.cu; fi
  if [ "$spec" != "$src" ]; then export MTPLX_WEIGHTS=${spec#*@}; else unset MTPLX_WEIGHTS; fi
  if [ -n "$kv" ]; then export MTPLX_KV_DTYPE=$kv; else unset MTPLX_KV_DTYPE; fi
}
passed=""
for k in $KERNELS; do
  src=${k%%[@/]*}
  if [ "$DEVICE" != cuda ]; then passed="$passed $k"; continue; fi
  if [ ! -f "$W/res/tests-$src.txt" ]; then
    use_source "$src"
    echo "== unit tests, kernels $src"
    MTPLX_CUDA_TESTS=1 "$G/libtest" cuda:: --test-threads 1 > "$W/res/tests-$src.txt" 2>&1
    echo $? > "$W/res/tests-$src.rc"
    grep "^test \|test result\|panicked\|vs " "$W/res/tests-$src.txt" | head -20
  fi
  [ "$(cat "$W/res/tests-$src.rc")" = 0 ] && passed="$passed $k"
done
KERNELS=${passed# }
for q in ${FILES:-q4_k_m q4_0}; do
  "$G/xtask" make-shaped --shape "${SHAPE:-llama3-8b}" --quant "$q" --seed 1 \
    --tokenizer-from "$G/tok.gguf" --out "$W/$q.gguf" | tail -1
done
[ -n "${llama_build:-}" ] && wait "$llama_build"
for q in ${FILES:-q4_k_m q4_0}; do
  for k in $KERNELS; do
    # SOURCE@WEIGHTS only for the K-quant file (Q4_0's default weights are already native).
    case "$q:$k" in q4_0:*@*) continue ;; esac
    use_source "$k"
    tag=${k//\//-kv}
    echo "== $q, kernels $k"
    llama=()
    parts=mtplx
    if [ "${RETURNING:-0}" = 1 ] && [ "$k" = "${KERNELS%% *}" ]; then
      parts=$parts,returning
    fi
    if [ "${LLAMA:-0}" = 1 ] && [ "$k" = "${KERNELS%% *}" ]; then
      llama=(--llama "$W/llama/build/bin/llama-server"); parts=$parts,llama
    fi
    python3 tools/bench/gpu_server.py --mtplx "$G/mtplx-serve" "${llama[@]}" --device "$DEVICE" \
      --model "$W/$q.gguf" --work "$W/$q-$tag" --parts "$parts" --modes ar \
      --sizes "${SIZES:-100,400}" --rounds "${ROUNDS:-2}" --gen "${GEN:-64}" \
      --out "$W/res/$q-$tag.json" 2>&1 | grep '^{"server' | cut -c1-220
    cp "$W/$q-$tag/mtplx.out" "$W/res/$q-$tag.out" 2>/dev/null
  done
done
tar czf "$OUT/gpu-run.tgz" -C "$W" res
