#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over what tools/bench/gpu_pack.sh
# packed into DIR (default .gl): the device and its copy bandwidth, the CUDA unit tests, the
# Llama-3-8B-shaped files written there (make-shaped), and each file through mtplx's server
# (tools/bench/gpu_server.py, plain decoding) for each kernel source in KERNELS (`builtin`,
# or NAME for DIR/k-NAME.cu through MTPLX_CUDA_KERNELS: the same binary times both in one
# run; each source's unit tests first, and only the sources that pass them are timed;
# SOURCE@WEIGHTS runs the server with MTPLX_WEIGHTS=WEIGHTS, e.g. builtin@native for a
# K-quant file's products with f32 activations; SOURCE[@WEIGHTS]/KV with MTPLX_KV_DTYPE=KV,
# e.g. builtin/f32 for K/V stored in f32 on the device; SOURCE...%VAR=VALUE[,VAR=VALUE] with
# those variables set for its server, e.g. builtin%MTPLX_CUDA_ATTEND_TILE=0);
# with LLAMA=1 llama.cpp's CUDA server too, built there from DIR/llama-src.tar.xz (and
# returned as $OUT/llama-bin.tar.xz: in DIR, later calls unpack it instead of building; a
# later call on the same warm machine finds the binaries in /tmp and builds nothing); with
# RETURNING=1 the returning conversation (gpu_server.py's "returning" part) for the first
# source too.
# Results: $OUT/gpu-run.tgz (JSON and server logs) and the printed lines.
# Knobs: FILES (q4_k_m q4_0), KERNELS (builtin), SIZES (100,400), ROUNDS (2), GEN (64),
# CONTEXT (the window the shaped files declare; the shape's own when unset), LLAMA_CTX
# (llama.cpp's -c, 8192), PARTS (gpu_server.py's parts, e.g. `llama` alone), DEVICE (cuda;
# cpu tries the script on a machine without a GPU with SHAPE=tiny). The knobs and the
# device go to res/run.json (`cargo xtask gpu-bench report` reads them). TESTED=1 skips the
# unit tests (an earlier call on the same warm machine ran them on the same binaries);
# TEST_ENV=VAR=VALUE[,VAR=VALUE] runs them with those variables set (e.g. the opt-in kernels'
# switches, whose tests then assert those kernels are taken).
set -uo pipefail
G=$(realpath "${1:-.gl}")
OUT=${OUT:-/tmp/gpu-out}
W=/tmp/gpu-run
# A warm machine keeps /tmp between calls: each call's results start from an empty folder
# (an earlier call's files would otherwise go out again, under this call's step).
rm -rf "$W/res"
mkdir -p "$OUT" "$W/res"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
# Unpacked every call, and renamed into place: `xtask gpu-bench run` may be running from
# its unpacked copy, whose file a rename leaves intact (writing over it would not).
(cd "$G" && for f in *.xz; do
  [ "$f" = llama-src.tar.xz ] || { xz -dc -T0 "$f" > "${f%.xz}.new" && mv -f "${f%.xz}.new" "${f%.xz}"; }
done; chmod +x mtplx-serve mtplx-serve-base xtask libtest 2>/dev/null)
if [ "$DEVICE" = cuda ]; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
  echo "$gpu"
  bw=$(python3 - <<'PY'
import torch, time
x = torch.empty(2**31, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.time()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); dt = (time.time() - t) / 10
print(f"{2 * x.numel() / dt / 1e12:.3f}")
PY
)
  echo "device copy bandwidth (read + write): $bw TB/s"
else
  gpu="cpu ($(nproc) threads)" bw=null
fi
PACK="$G" GPU="$gpu" BW="$bw" python3 - "$W/res/run.json" <<'PY'
import json, os, sys, time
knobs = ("FILES", "KERNELS", "SIZES", "ROUNDS", "GEN", "CONTEXT", "LLAMA_CTX", "LLAMA", "RETURNING",
         "PARTS", "SHAPE", "DEVICE", "STEP", "TESTED", "TEST_ENV")
# The commit the binaries were built from (gpu_pack.sh writes it; the device's copy of the
# tree may have no .git).
commit = open(os.environ["PACK"] + "/commit").read().strip() if os.path.exists(os.environ["PACK"] + "/commit") else None
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": os.environ["GPU"],
           "copy_tb_s": None if os.environ["BW"] == "null" else float(os.environ["BW"]),
           "commit": commit, "knobs": {k: os.environ[k] for k in knobs if k in os.environ}},
          open(sys.argv[1], "w"), indent=1)
PY
# llama.cpp builds (about 5 minutes) while the unit tests run and the files are written.
if [ "${LLAMA:-0}" = 1 ]; then
  if [ -f "$G/llama-bin.tar.xz" ]; then
    # Built on an earlier call and carried back (see below): no build.
    mkdir -p "$W/llama/build/bin" && tar xJf "$G/llama-bin.tar.xz" -C "$W/llama/build/bin"
  elif [ -x "$W/llama/build/bin/llama-server" ] && [ -x "$W/llama/build/bin/llama-bench" ]; then
    # Built by an earlier call on this warm machine (/tmp outlives a call): no build. (The
    # packed binaries are too large to come back from a call.)
    echo "llama.cpp: built by an earlier call on this machine"
  else
    # Built here, and the static binaries packed into $OUT: put the file in DIR to carry it
    # next time and skip these minutes.
    (bash tools/bench/build_llama_cuda.sh "$G/llama-src.tar.xz" "$W/llama" &&
      XZ_OPT=-T0 tar -C "$W/llama/build/bin" -cJf "$OUT/llama-bin.tar.xz" llama-server llama-bench) &
    llama_build=$!
  fi
fi
# The unit tests for each kernel source: a source that fails them is not timed.
KERNELS=${KERNELS:-builtin}
set_by_spec=""
use_source() {
  local whole=$1 envs=
  # SPEC%VAR=VALUE,...: the variables for this run only (those of the previous run unset).
  for v in $set_by_spec; do unset "$v"; done
  set_by_spec=""
  if [ "${whole#*%}" != "$whole" ]; then
    envs=${whole#*%}
    whole=${whole%%\%*}
    local IFS=,
    for kv_pair in $envs; do
      export "${kv_pair?}"
      set_by_spec="$set_by_spec ${kv_pair%%=*}"
    done
    unset IFS
  fi
  local spec=${whole%%/*} kv=
  [ "$whole" != "$spec" ] && kv=${whole#*/}
  local src=${spec%@*}
  if [ "$src" = builtin ]; then unset MTPLX_CUDA_KERNELS; else export MTPLX_CUDA_KERNELS=$G/k-$src.cu; fi
  if [ "$spec" != "$src" ]; then export MTPLX_WEIGHTS=${spec#*@}; else unset MTPLX_WEIGHTS; fi
  if [ -n "$kv" ]; then export MTPLX_KV_DTYPE=$kv; else unset MTPLX_KV_DTYPE; fi
}
passed=""
for k in $KERNELS; do
  src=${k%%[@/%]*}
  if [ "$DEVICE" != cuda ] || [ "${TESTED:-0}" = 1 ]; then passed="$passed $k"; continue; fi
  if [ ! -f "$W/res/tests-$src.txt" ]; then
    use_source "$src"
    echo "== unit tests, kernels $src${TEST_ENV:+, with $TEST_ENV}"
    (
      IFS=,
      for kv_pair in ${TEST_ENV:-}; do export "${kv_pair?}"; done
      MTPLX_CUDA_TESTS=1 "$G/libtest" cuda:: --test-threads 1
    ) > "$W/res/tests-$src.txt" 2>&1
    echo $? > "$W/res/tests-$src.rc"
    grep "^test \|test result\|panicked\|vs " "$W/res/tests-$src.txt" | head -20
  fi
  [ "$(cat "$W/res/tests-$src.rc")" = 0 ] && passed="$passed $k"
done
KERNELS=${passed# }
for q in ${FILES-q4_k_m q4_0}; do
  "$G/xtask" make-shaped --shape "${SHAPE:-llama3-8b}" --quant "$q" --seed 1 \
    ${CONTEXT:+--context "$CONTEXT"} --tokenizer-from "$G/tok.gguf" --out "$W/$q.gguf" | tail -1
done
[ -n "${llama_build:-}" ] && wait "$llama_build"
for q in ${FILES-q4_k_m q4_0}; do
  for k in $KERNELS; do
    # SOURCE@WEIGHTS only for the K-quant file (Q4_0's default weights are already native).
    case "$q:$k" in q4_0:*@*) continue ;; esac
    use_source "$k"
    tag=${k//\//-kv}
    tag=${tag//%/-env-}
    tag=${tag//=/-}
    tag=${tag//,/-}
    echo "== $q, kernels $k"
    llama=()
    parts=mtplx
    if [ "${RETURNING:-0}" = 1 ] && [ "$k" = "${KERNELS%% *}" ]; then
      parts=$parts,returning
    fi
    if [ "${LLAMA:-0}" = 1 ] && [ "$k" = "${KERNELS%% *}" ]; then
      llama=(--llama "$W/llama/build/bin/llama-server"); parts=$parts,llama
    fi
    # PARTS: gpu_server.py's parts instead (e.g. `llama` alone, a call of its own).
    parts=${PARTS:-$parts}
    base=()
    # DIR/mtplx-serve-base (optional, packed by hand): the returning part's restore timed with
    # it and with DIR/mtplx-serve in turn.
    [ -x "$G/mtplx-serve-base" ] && base=(--mtplx-base "$G/mtplx-serve-base")
    python3 tools/bench/gpu_server.py --mtplx "$G/mtplx-serve" "${base[@]}" "${llama[@]}" --device "$DEVICE" \
      --model "$W/$q.gguf" --work "$W/$q-$tag" --parts "$parts" --modes ar \
      --sizes "${SIZES:-100,400}" --rounds "${ROUNDS:-2}" --gen "${GEN:-64}" \
      --llama-ctx "${LLAMA_CTX:-8192}" \
      --out "$W/res/$q-$tag.json" 2>&1 | grep '^{"server' | cut -c1-220
    cp "$W/$q-$tag/mtplx.out" "$W/res/$q-$tag.out" 2>/dev/null
    # Every server's log and request log (the returning part starts several).
    mkdir -p "$W/res/$q-$tag-logs"
    cp "$W/$q-$tag"/*.out "$W/$q-$tag"/*.jsonl "$W/res/$q-$tag-logs/" 2>/dev/null
  done
done
tar czf "$OUT/gpu-run.tgz" -C "$W" res
