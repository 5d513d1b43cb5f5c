#!/bin/bash
# mtplx-serve under Nsight Compute, for gpu_server.py's --mtplx (which starts the server,
# sends its requests and stops it with SIGTERM): NCU_ARGS names the window and what to
# collect, NCU_LOG the report; SIGTERM stops the server only, so ncu writes its report.
# The server binary is MTPLX_SERVE.
# e.g. NCU_ARGS="--clock-control none --graph-profiling node --launch-skip 3000
#      --launch-count 300 --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv"
#      NCU_LOG=$OUT/ncu.csv MTPLX_SERVE=.gl/mtplx-serve \
#      python3 tools/bench/gpu_server.py --mtplx tools/bench/ncu_serve.sh ...
# then tools/bench/ncu_summary.py $OUT/ncu.csv.
serve=${MTPLX_SERVE:?the server binary}
serve=$(realpath "$serve")
# shellcheck disable=SC2086 # NCU_ARGS is a list of flags
ncu $NCU_ARGS --log-file "$NCU_LOG" "$serve" "$@" &
pid=$!
trap 'pkill -TERM -f "^$serve"; wait $pid; exit 0' TERM
wait $pid
