#!/usr/bin/env bash
# watchdog.sh SECONDS COMMAND...: run COMMAND in a process group of its own; if it is still running after SECONDS,
# print what is stuck (the process tree, then every Python process's stacks: py-spy when installed, else the
# faulthandler dump that tests/conftest.py registers on SIGUSR1), end the group and exit 124. Otherwise exit with
# COMMAND's status. .ci/run runs `make test` under it, well inside CI's 90 minutes.
set -uo pipefail
limit=$1; shift
setsid "$@" &
pid=$!
fired=$(mktemp)
(
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM  # the run ended: no sleep is left behind holding our output open
  sleep "$limit" & nap=$!
  wait "$nap"
  kill -0 "$pid" 2>/dev/null || exit 0
  echo 1 > "$fired"
  echo "[watchdog] still running after ${limit} s: what is stuck" >&2
  pids=$(ps -o pid= -g "$pid" 2>/dev/null | tr -s ' \n' ' ')
  ps -o pid,ppid,etime,stat,args -g "$pid" >&2 || true
  spy=$(command -v py-spy || ls "$(dirname "$0")/../.venv/bin/py-spy" 2>/dev/null || true)
  for p in $pids; do
    grep -qa python "/proc/$p/cmdline" 2>/dev/null || continue
    echo "[watchdog] stacks of $p: $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-160)" >&2
    if [ -n "$spy" ]; then timeout 20 "$spy" dump --pid "$p" >&2 || kill -USR1 "$p" 2>/dev/null
    else kill -USR1 "$p" 2>/dev/null; fi
  done
  sleep 2
  kill -TERM -- "-$pid" 2>/dev/null; sleep 10; kill -KILL -- "-$pid" 2>/dev/null
) &
dog=$!
rc=0
wait "$pid" || rc=$?
kill "$dog" 2>/dev/null; wait "$dog" 2>/dev/null
if [ -s "$fired" ]; then rm -f "$fired"; echo "[watchdog] stopped after ${limit} s" >&2; exit 124; fi
rm -f "$fired"
exit "$rc"
