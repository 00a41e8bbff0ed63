#!/usr/bin/env bash
# Issue 30's figures in one device call: the product server (`linguafusion serve`, ASR on the engine with the shipped
# tiny.en, MT on it from a random-weight Marian directory loaded as a user's, en -> es) over real WebSockets, then the
# same server serving one item at a time (`MODELS__ENGINE_MAX_BATCH=1`, one model process): the per-stream baseline.
# Run from the .gpurun bundle made here (docs/benchmarks.md, "Issue 30's figures in one call"), on the GPU machine:
#
#   bash bench/gpu_product.sh OUTDIR            # then, here:
#   .venv/bin/python bench/gpu_product.py OUTDIR/run.json --baseline OUTDIR/base.json --gpu-time-s N
#
# Model processes: 6 on an H200 (141 GB), 3 on an H100 (80 GB: 6 ran it out of memory). STREAMS, BASE_STREAMS and
# BUDGET_S (the main run's seconds; the baseline gets 210 more) override the defaults. PARTS (default run,base) picks
# what runs: ``check`` first compares the engine's transcripts on this GPU with the CPU's (bench/gpu_server_path.py,
# about 90 s; OUTDIR/transcripts.json), ``run`` the product server, ``base`` the baseline; a device call is 10
# minutes at most, so PARTS=check,run in one call and PARTS=base in the next. Writes OUTDIR/run.json and
# OUTDIR/base.json (each saved after every row) and prints the warnings and errors of each server's log.
source bench/gpu_setup.sh "${1:?output directory}" 800,1600,3200 500,900,2700
echo "$gpu: $m model processes, streams $streams"
logs() {  # the newest server log's warnings and errors, counted
  grep -v "Loading weights" "$(ls -t /tmp/lf-gpuserve-*/server.log | head -1)" | grep "WARNING\|ERROR\|illegal" \
    | cut -c1-200 | sort | uniq -c | sort -rn | head -8
}
parts=${PARTS:-run,base}
for part in ${parts//,/ }; do
  case $part in check|run|base) ;; *) echo "PARTS: $part is none of check, run, base" >&2; exit 2 ;; esac
done
if [[ $parts == *check* ]]; then
  timeout 150 python3 bench/gpu_server_path.py run serve --parts transcripts --json "$out/transcripts.json" 2>&1 \
    | grep "SUMMARY\|Error\|error" | tail -4
fi
budget=${BUDGET_S:-330}
[[ $parts == *run* ]] && timeout $((budget + 20)) python3 bench/gpu_serve.py run serve --mt-dir mt-en-es --to es --workers 12 \
  --model-processes "$m" --warmup-s 20 --streams "$streams" --duration 20 --budget-s "$budget" --stop-p99-s 60 \
  --json "$out/run.json" 2>&1 | grep -v Warning | grep -v "^n=" | tail -8
[[ $parts == *run* ]] && logs
[[ $parts == *base* ]] && LINGUAFUSION_MODELS__ENGINE_MAX_BATCH=1 timeout 230 python3 bench/gpu_serve.py run serve --mt-dir mt-en-es --to es \
  --workers 2 --model-processes 1 --warmup-s 10 --streams "${BASE_STREAMS:-16,32,64}" --duration 20 --budget-s 210 \
  --stop-p99-s 10 --port 18700 --json "$out/base.json" 2>&1 | grep -v Warning | grep -v "^n=" | tail -6
[[ $parts == *base* ]] && logs
true
