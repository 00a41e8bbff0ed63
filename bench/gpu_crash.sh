#!/usr/bin/env bash
# The runs that look for the cause of the H200 crash of issue 12 (four model processes with the encoder graphs hit
# "CUDA error: an illegal memory access" at 900 streams; docs/benchmarks.md, bench/results/gpu_encoder_graphs.json).
# Since the graphs are captured on the runner threads that replay them, `both` ran clean (bench/results/
# gpu_crash_both.json); the other runs are kept for a recurrence.
# One run per device call: the model processes take about 3 minutes to start and capture, so each needs >= 300 s.
#
#   bench/gpu_crash.sh RUN OUTDIR     RUN: blocking | no-workspace | no-graphs | asr | mt | both
#   STREAMS=900,1200,2000 bench/gpu_crash.sh both OUTDIR   sweep on past 900 while the rows meet p99 <= 3 s
#
# Writes OUTDIR/RUN.json (the benchmark's figures, saved after every row) and OUTDIR/RUN.log (every process's
# output, where a model process's "GPU runner step failed" traceback lands), then prints the lines that say whether
# it crashed and where.
set -u
run=${1:?run: blocking | no-workspace | no-graphs | asr | mt | both}
out=${2:?output directory}
mkdir -p "$out"
args=(bench/gpu_streams.py --json "$out/$run.json" --warmup 0 --parts multi --model-processes 4 --multi-workers 12
      --multi-streams "${STREAMS:-900}" --seconds 15)
case "$run" in
  blocking) env CUDA_LAUNCH_BLOCKING=1 python3 "${args[@]}" > "$out/$run.log" 2>&1 ;;  # names the faulting launch
  no-workspace) env CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 python3 "${args[@]}" > "$out/$run.log" 2>&1 ;;
  no-graphs) python3 "${args[@]}" --no-encoder-graphs > "$out/$run.log" 2>&1 ;;
  asr|mt) python3 "${args[@]}" --encoder-graphs "$run" > "$out/$run.log" 2>&1 ;;
  both) python3 "${args[@]}" > "$out/$run.log" 2>&1 ;;
  *) echo "unknown run: $run" >&2; exit 2 ;;
esac
echo "$run: exit $?"
grep -m1 -A14 "GPU runner step failed" "$out/$run.log" || echo "$run: no runner failure logged"
grep -c "illegal memory access" "$out/$run.log" | sed "s/^/$run: illegal-access lines: /"
grep "^multi" "$out/$run.log" || echo "$run: no row measured"
