#!/usr/bin/env bash
# The default model's decode speed on a GPU machine in one call, without carrying the model:
# the GPU machine writes a file of its shape (`xtask make-shaped --shape smollm2-135m --quant
# q4_1`, seeded random weights: speed needs no real ones) and runs the ignored speed test
# `cuda_backend decode_speed` once per variant, the variants alternated, ROUNDS times.
#   tools/bench/gpu_speed.sh pack DIR [REV]  (here) the test binary, xtask and a tokenizer
#                                            source, stripped and xz-compressed, into DIR
#                                            (git ignores .gt/); with REV also that commit's
#                                            kernels.cu as DIR/k-REV.cu, for a variant
#                                            `MTPLX_CUDA_KERNELS=DIR/k-REV.cu`
#   tools/bench/gpu_speed.sh run DIR VARIANT...  (there, carrying DIR) each VARIANT a list of
#                                            NAME=VALUE settings joined by commas, or `-`
#                                            for none; DIR/ in a value is the carried DIR
# e.g. run .gt/speed - MTPLX_CUDA_PDL=1 MTPLX_CUDA_KERNELS=DIR/k-af35186.cu
# Results: $OUT/speed.txt (ROUNDS, default 2).
set -euo pipefail
cmd=$1
dir=$(realpath -m "${2:?DIR}")
cd "$(dirname "$0")/../.."
case $cmd in
pack)
  mkdir -p "$dir"
  git describe --always --dirty --abbrev=7 > "$dir/commit"
  . tools/bench/built.sh
  test_bin=$(built -p mtplx-model --features cuda --test cuda_backend \
    | awk '$1 == "cuda_backend" { print $2 }' | tail -1)
  strip -o "$dir/cuda_backend" "$test_bin" && xz -T0 -6 -f "$dir/cuda_backend"
  cargo build --release -p xtask
  strip -o "$dir/xtask" target/release/xtask && xz -T0 -6 -f "$dir/xtask"
  target/release/xtask make-shaped --shape tiny --seed 1 --out "$dir/tok.gguf" >/dev/null
  xz -T0 -6 -f "$dir/tok.gguf"
  if [ -n "${3:-}" ]; then
    git show "$3:crates/mtplx-model/src/cuda/kernels.cu" > "$dir/k-$3.cu"
  fi
  du -sh "$dir"
  ;;
run)
  shift 2
  OUT=${OUT:-/tmp/gpu-out}
  mkdir -p "$OUT"
  for f in cuda_backend xtask tok.gguf; do xz -dkfc "$dir/$f.xz" > "/tmp/speed-$f"; done
  chmod +x /tmp/speed-cuda_backend /tmp/speed-xtask
  /tmp/speed-xtask make-shaped --shape smollm2-135m --quant q4_1 --seed 1 \
    --tokenizer-from /tmp/speed-tok.gguf --out /tmp/speed-model.gguf | tail -1
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  export MTPLX_TEST_MODEL=/tmp/speed-model.gguf
  {
    echo "binaries of $(cat "$dir/commit"); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    for round in $(seq "${ROUNDS:-2}"); do
      for variant in "$@"; do
        settings=()
        if [ "$variant" != - ]; then
          IFS=, read -ra settings <<< "${variant//DIR\//$dir/}"
        fi
        echo "== round $round: ${settings[*]:-defaults}"
        env "${settings[@]}" /tmp/speed-cuda_backend --ignored decode_speed --nocapture \
          --test-threads 1 2>&1 | grep -E "^context|panicked" || true
      done
    done
  } | tee "$OUT/speed.txt"
  ;;
*)
  echo "usage: $0 pack DIR [REV] | run DIR VARIANT..." >&2
  exit 2
  ;;
esac
