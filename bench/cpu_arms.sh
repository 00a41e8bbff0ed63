#!/usr/bin/env bash
# Server settings A/B on this machine's CPU: each arm a fresh `linguafusion serve` as a user starts it (auth off,
# embedded defaults, one process) with its settings as environment variables, loaded by `linguafusion bench load
# --all` at the same counts; the arms alternate ROUNDS times (A B A B: the machine's drift falls on both).
#
#   ARMS="plain=- full10=SERVER__PARTIAL_PACE_FULL:10" STREAMS=2,12,36 ROUNDS=2 bash bench/cpu_arms.sh OUTDIR
#
# Writes OUTDIR/ARM_ROUND.json (the load generator's report) and prints each row.
set -euo pipefail
out=${1:?output directory}
mkdir -p "$out"
arms=${ARMS:-"plain=-"}
streams=${STREAMS:-2,12,36}
rounds=${ROUNDS:-2}
port=${PORT:-18777}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/arms.sh"
for round in $(seq "$rounds"); do
  for arm in $arms; do
    arm_env "$arm"
    env "${envs[@]}" "$root/.venv/bin/linguafusion" serve --no-auth --port "$port" > "$out/serve_${name}_$round.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/readyz" > /dev/null && break; sleep 1; done
    echo "arm $name round $round: ${envs[*]:-defaults}"
    timeout 900 "$root/.venv/bin/linguafusion" bench load --url "http://127.0.0.1:$port" --streams "$streams" --all \
      --duration 30 --json "$out/${name}_$round.json" | grep "n=" || true
    kill "$pid"
    wait "$pid" || true
  done
done
