#!/usr/bin/env bash
# The product server's runner settings A/B in one device call (docs/benchmarks.md, "The product server on an H100
# with admission by step timings"): each arm a fresh `linguafusion serve` (bench/gpu_serve.py, ASR and MT on the
# GPU, en -> es) at the same offered loads, with its settings as environment variables. From the .gpurun bundle:
#
#   bash bench/gpu_arms.sh OUTDIR                        # then, here, for each OUTDIR/arm_*.json:
#   .venv/bin/python bench/gpu_product.py OUTDIR/arm_gather10.json --gpu-time-s N --json /tmp/x.json
#
# ARMS: space-separated NAME=VAR:VALUE,VAR:VALUE ("-" for none); STREAMS overrides the loads (default 900,2700 on
# an H100 with 3 model processes, 1600,3200 on an H200 with 6); ARM_S an arm's seconds (220); SERVE_ARGS
# more gpu_serve.py options (--profile-s 12: py-spy samples beside each arm's JSON).
source bench/arms.sh
source bench/gpu_setup.sh "${1:?output directory}" 1600,3200 900,2700
arms=${ARMS:-"plain=- gather10=MODELS__ENGINE_GATHER_MS:10 gather10_switch05=MODELS__ENGINE_GATHER_MS:10,MODELS__SWITCH_INTERVAL_MS:0.5"}
arm_s=${ARM_S:-220}  # ~60 s to start and warm up, then each row (n streams: ~85 + n/100 s)
echo "$gpu: $m model processes, streams $streams, arms: $arms"
for arm in $arms; do
  arm_env "$arm"
  echo "arm $name: ${envs[*]:-defaults}"
  env "${envs[@]}" timeout $((arm_s + 15)) python3 bench/gpu_serve.py run serve --mt-dir mt-en-es --to es --workers 12 \
    --model-processes "$m" --warmup-s 15 --streams "$streams" --duration 20 --budget-s "$arm_s" --stop-p99-s 60 \
    --json "$out/arm_$name.json" ${SERVE_ARGS:-} 2>&1 | grep -v Warning | grep -v "^n=" | tail -4
done
true
