#!/usr/bin/env bash
# Runs a command with a real redis-server (AOF on) on a free loopback port; exports LINGUAFUSION_TEST_REDIS_URL.
set -euo pipefail
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --appendonly yes --save "" --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
cleanup() {  # redis-server writes into $dir as it shuts down: wait for it (5 s at most) before removing $dir,
  # and keep the command's exit status (a cleanup that could not remove the folder failed a green run once)
  local rc=$? pid
  if [ -f "$dir/redis.pid" ]; then
    pid=$(cat "$dir/redis.pid"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$dir" || true
  exit "$rc"
}
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export LINGUAFUSION_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
export LINGUAFUSION_REDIS_SERVER=$(command -v redis-server)
"$@"
