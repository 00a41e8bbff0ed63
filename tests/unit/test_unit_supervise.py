"""Supervised worker processes (supervise/): the restart policy on a hand-driven clock, and WorkerProcess against
a real child process that answers, crashes with a real signal, hangs or dies between calls."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lingua_fusion.errors import BackendError, BackendFailed, ModelTimeout
from lingua_fusion.supervise import RestartPolicy, WorkerProcess, WorkerState

# ---- the policy, on a clock the test moves ------------------------------------------------------------------------


def test_the_first_restart_is_at_once_then_it_backs_off() -> None:
    p = RestartPolicy(loop_crashes=5, backoff_s=(0.0, 0.5, 2.0))
    assert p.verdict(0.0).state is WorkerState.READY
    p.crashed(10.0, "SIGSEGV")
    assert p.verdict(10.0).state is WorkerState.READY  # one crash costs only the work in flight
    p.crashed(10.1, "SIGSEGV")
    v = p.verdict(10.2)
    assert v.state is WorkerState.BACKOFF and v.wait_s == pytest.approx(0.4) and "SIGSEGV" in v.reason
    assert p.verdict(10.7).state is WorkerState.READY
    p.answered()  # a request served: the run of crashes is over
    p.crashed(11.0, "SIGKILL")
    assert p.verdict(11.0).state is WorkerState.READY


def test_a_crash_loop_makes_the_worker_unavailable_then_tries_again() -> None:
    p = RestartPolicy(loop_crashes=3, loop_window_s=60.0, cooldown_s=30.0, backoff_s=(0.0,))
    for t in (0.0, 1.0, 2.0):
        p.crashed(t, "SIGSEGV")
    v = p.verdict(3.0)
    assert v.state is WorkerState.UNAVAILABLE and v.wait_s == pytest.approx(29.0)
    assert "crashed 3 times within 60 s (last: SIGSEGV)" in v.reason
    assert p.verdict(31.9).state is WorkerState.UNAVAILABLE
    assert p.verdict(32.0).state is WorkerState.READY  # cool-down over: one more try, history forgotten
    p.crashed(33.0, "SIGSEGV")
    assert p.verdict(33.0).state is WorkerState.READY  # one crash after the cool-down is not yet a loop


def test_crashes_spread_wider_than_the_window_are_no_loop() -> None:
    p = RestartPolicy(loop_crashes=3, loop_window_s=10.0, backoff_s=(0.0,))
    for t in (0.0, 6.0, 12.0, 18.0):
        p.crashed(t, "exit status 1")
    assert p.verdict(18.0).state is WorkerState.READY
    assert p.crashes == 4


# ---- a real worker process ----------------------------------------------------------------------------------------
MAGIC = b"TST1"
WORKER = textwrap.dedent('''
    import ctypes, json, os, struct, sys, time
    sys.path.insert(0, sys.argv[1])
    from lingua_fusion.supervise import wire
    H = struct.Struct(wire.HEADER_FORMAT)
    out = wire.protocol_stdout()
    print("worker up", flush=True)  # goes to stderr, never into the protocol
    while True:
        try:
            magic, rid, jlen, plen = H.unpack(wire.read_exact(sys.stdin.buffer, H.size))
        except EOFError:
            break
        req = json.loads(wire.read_exact(sys.stdin.buffer, jlen))
        op = req["op"]
        if op == "segv":
            print("about to crash", file=sys.stderr, flush=True)
            ctypes.string_at(0)
        if op == "sleep":
            time.sleep(req["s"])
        if op == "fail":
            wire.send(out, H, magic, rid, {"ok": False, "error": "no such thing"})
            continue
        wire.send(out, H, magic, rid, {"ok": True, "pid": os.getpid(), "echo": req.get("x")})
''')


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    src = str(Path(__file__).resolve().parents[2] / "src")
    w = WorkerProcess("test-worker", [sys.executable, str(script), src], magic=MAGIC, start_timeout_s=30,
                      policy=RestartPolicy(loop_crashes=3, loop_window_s=60, cooldown_s=2, backoff_s=(0.0,)))
    yield w
    w.close()


def test_a_segfault_costs_the_request_in_flight_and_the_next_one_succeeds(worker: WorkerProcess) -> None:
    first = worker.call({"op": "echo", "x": "hello"}, timeout_s=10)[0]
    assert first["echo"] == "hello"
    with pytest.raises(BackendFailed) as crash:
        worker.call({"op": "segv"}, timeout_s=10)
    assert "SIGSEGV" in crash.value.message and "about to crash" in worker.last_words()
    assert crash.value.code == "backend_failed" and crash.value.status == 503 and crash.value.retryable
    again = worker.call({"op": "echo", "x": "again"}, timeout_s=10)[0]
    assert again["echo"] == "again" and again["pid"] != first["pid"]  # a new worker
    h = worker.health()
    assert (h.state, h.restarts, h.crashes) == ("ready", 1, 1)


def test_a_hang_past_the_deadline_kills_the_worker(worker: WorkerProcess) -> None:
    pid = worker.call({"op": "echo"}, timeout_s=10)[0]["pid"]
    started = time.monotonic()
    with pytest.raises(ModelTimeout):
        worker.call({"op": "sleep", "s": 60}, timeout_s=0.5)
    assert time.monotonic() - started < 10
    with pytest.raises(ProcessLookupError):  # killed, not left running
        os.kill(pid, 0)
    assert worker.call({"op": "echo", "x": 1}, timeout_s=10)[0]["echo"] == 1


def test_a_worker_killed_between_calls_is_counted_and_replaced(worker: WorkerProcess) -> None:
    pid = worker.call({"op": "echo"}, timeout_s=10)[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.call({"op": "echo", "x": 2}, timeout_s=10)[0]["echo"] == 2
    assert worker.health().crashes == 1


def test_an_error_answer_is_a_backend_error_and_the_worker_lives_on(worker: WorkerProcess) -> None:
    pid = worker.call({"op": "echo"}, timeout_s=10)[0]["pid"]
    with pytest.raises(BackendError, match="no such thing") as err:
        worker.call({"op": "fail"}, timeout_s=10)
    assert not isinstance(err.value, BackendFailed)
    assert worker.call({"op": "echo"}, timeout_s=10)[0]["pid"] == pid


def test_a_crash_loop_fails_fast_with_the_reason_then_recovers(worker: WorkerProcess) -> None:
    for _ in range(3):
        with pytest.raises(BackendFailed):
            worker.call({"op": "segv"}, timeout_s=10)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"unavailable: crashed 3 times .*SIGSEGV") as err:
        worker.call({"op": "echo"}, timeout_s=10)
    assert time.monotonic() - started < 0.5 and worker.pid() is None  # nothing was started
    assert err.value.retry_after > 0 and worker.health().state == "unavailable"
    time.sleep(2.1)  # the cool-down (2 s here)
    assert worker.call({"op": "echo", "x": 3}, timeout_s=10)[0]["echo"] == 3
    assert worker.health().state == "ready"


def test_a_call_waiting_behind_a_slow_one_is_bounded_too(worker: WorkerProcess) -> None:
    worker.call({"op": "echo"}, timeout_s=10)
    slow = threading.Thread(target=lambda: worker.call({"op": "sleep", "s": 2}, timeout_s=10))
    slow.start()
    time.sleep(0.2)
    with pytest.raises(ModelTimeout, match="busy"):
        worker.call({"op": "echo"}, timeout_s=0.3)
    slow.join(timeout=10)


def test_the_frames_hold_unicode_both_ways(worker: WorkerProcess) -> None:
    assert worker.call({"op": "echo", "x": "早上好 Grüße"}, timeout_s=10)[0]["echo"] == "早上好 Grüße"
