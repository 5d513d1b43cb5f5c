#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the CUDA integration tests that need
# the default model (crates/mtplx-model/tests/cuda_backend.rs, crates/mtplx-spec/tests/
# cuda_lossless.rs, tests/tests/serve_cuda.rs), from binaries built here and carried:
#   tools/bench/gpu_tests.sh pack DIR    (here) the test binaries, stripped and xz-compressed,
#                                        into DIR/t, and the default model in three pieces,
#                                        DIR/a, DIR/b and DIR/c (a call carries at most
#                                        64 MiB, the tracked tree included)
#   tools/bench/gpu_tests.sh model DIR   (there, carrying DIR/a, then DIR/b, then DIR/c with
#                                        DIR/t) keeps the pieces in /tmp/gpu-model and, once
#                                        all are there, checks the whole file
#   tools/bench/gpu_tests.sh run DIR     (there, carrying DIR/t) runs the tests with
#                                        MTPLX_CUDA_TESTS=1
# The calls must follow one another while the machine is warm (30 s), or /tmp is gone.
# The binaries name the checkout they were built in (fixtures, the server under test), so
# "run" links that path to this one when they differ. Results: $OUT/gpu-tests.txt.
set -euo pipefail
cmd=$1
dir=$(realpath -m "${2:-.gt}")
cd "$(dirname "$0")/../.."
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case $cmd in
pack)
  mkdir -p "$dir/t" "$dir/a" "$dir/b" "$dir/c"
  # (A pack stopped before its end leaves paths.new behind: start it afresh.)
  rm -f "$dir/t/paths.new"
  . tools/bench/built.sh
  {
    built -p mtplx-model --features cuda --test cuda_backend
    built -p mtplx-spec --features cuda --test cuda_lossless
    built -p mtplx-tests --features cuda --test serve_cuda
  } | while read -r name path; do
    case $name in cuda_backend | cuda_lossless | serve_cuda | mtplx-serve-under-test) ;; *) continue ;; esac
    strip -o "$dir/t/$name" "$path"
    xz -T0 -6 -f "$dir/t/$name"
    echo "$name $path" >> "$dir/t/paths.new"
  done
  mv "$dir/t/paths.new" "$dir/t/paths"
  model=${MTPLX_TEST_MODEL:-${MTPLX_HOME:-$HOME/.mtplx}/models/$MODEL}
  # Three pieces: a call's 64 MiB hold the tracked tree (about 14 MB) as well, and the
  # last piece goes with the test binaries.
  # (dd, not tail | head: under pipefail, tail's SIGPIPE when head is done fails the script.)
  piece() { dd if="$model" of="$dir/$1/m.part" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
  piece a 0 36000000
  piece b 36000000 36000000
  piece c 72000000
  du -sh "$dir"/*
  ;;
model)
  mkdir -p /tmp/gpu-model
  for p in a b c; do [ -f "$dir/$p/m.part" ] && cp "$dir/$p/m.part" "/tmp/gpu-model/$p.part"; done
  if [ -f /tmp/gpu-model/a.part ] && [ -f /tmp/gpu-model/b.part ] && [ -f /tmp/gpu-model/c.part ]; then
    cat /tmp/gpu-model/a.part /tmp/gpu-model/b.part /tmp/gpu-model/c.part > "/tmp/gpu-model/$MODEL"
    echo "$SHA  /tmp/gpu-model/$MODEL" | sha256sum -c
  fi
  ls -la /tmp/gpu-model
  ;;
run)
  OUT=${OUT:-/tmp/gpu-out}
  mkdir -p "$OUT"
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  export MTPLX_CUDA_TESTS=1 MTPLX_TEST_MODEL=/tmp/gpu-model/$MODEL
  # Where the binaries were built: fixtures and the server under test are found there.
  built_root=$(awk '$1 == "serve_cuda" { sub("/target/.*", "", $2); print $2 }' "$dir/t/paths")
  if [ "$(realpath -m "$built_root")" != "$(pwd)" ]; then
    mkdir -p "$(dirname "$built_root")"
    ln -sfn "$(pwd)" "$built_root"
  fi
  while read -r name path; do
    xz -dkfc "$dir/t/$name.xz" > "$dir/t/$name"
    chmod +x "$dir/t/$name"
    if [ "$name" = mtplx-serve-under-test ]; then
      mkdir -p "$(dirname "$path")"
      cp "$dir/t/$name" "$path"
    fi
  done < "$dir/t/paths"
  rc=0
  for t in ${TESTS:-cuda_backend cuda_lossless serve_cuda}; do
    echo "== $t" | tee -a "$OUT/gpu-tests.txt"
    set +e
    "$dir/t/$t" --test-threads 1 >> "$OUT/gpu-tests.txt" 2>&1
    [ $? = 0 ] || rc=1
    set -e
    sed -n "/^== $t\$/,\$p" "$OUT/gpu-tests.txt" | grep -E "^test |test result|panicked|worst|device:" || true
  done
  exit $rc
  ;;
*)
  echo "usage: $0 pack|model|run DIR" >&2
  exit 2
  ;;
esac
