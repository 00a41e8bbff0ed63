"""The Apertium pool's processes end with their whole pipeline (models/mt_apertium.py).

``apertium`` is a shell script that runs its stages as a pipeline of children; the pool starts it in a session of
its own, so killing only the script leaves the stages running, holding the pipe the pool reads. A stage that hangs
(the case TIMEOUT_S is for) must still end the call with ``BackendError``, and closing the pool must not leave
stages behind. Unit test of one part: a stand-in ``apertium`` on PATH whose pipeline hangs like a stuck stage.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lingua_fusion.errors import BackendError
from lingua_fusion.models import mt_apertium

HANG_BOUND_S = 30.0  # a call that has not returned by then hangs (the stand-in's stage sleeps 600 s)


def _group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` still running (a killed stage may stay a zombie until init reaps it)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _ended(pgid: int) -> bool:
    """Every process of group ``pgid`` ended (a SIGKILL is delivered asynchronously: looked for up to 10 s)."""
    for _ in range(100):
        if not _group_alive(pgid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def stuck_apertium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "apertium"
    script.write_text("#!/bin/bash\nsleep 600 | cat\n")  # the script's children hold its stdout, like the stages
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(mt_apertium, "TIMEOUT_S", 1.0)


def test_a_hung_pipeline_ends_the_call_and_leaves_no_stage_running(stuck_apertium: None) -> None:
    pool = mt_apertium._Pool("eng-spa", 1)
    proc = pool._ready.queue[0]
    outcome: list[BaseException | str] = []

    def call() -> None:
        try:
            outcome.append(pool.run("hello\n"))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    try:
        caller.start()
        caller.join(HANG_BOUND_S)
        assert not caller.is_alive(), "the call hung after its timeout: the pipeline's stages outlived the kill"
        assert len(outcome) == 1 and isinstance(outcome[0], BackendError), outcome
        assert _ended(proc.pid)  # no stage of the timed-out process left
    finally:
        for p in [proc, *list(pool._ready.queue)]:
            if _group_alive(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
        pool.close()
        proc.wait(timeout=5)


def test_closing_the_pool_ends_the_pooled_pipelines(stuck_apertium: None) -> None:
    pool = mt_apertium._Pool("eng-spa", 2)
    procs = list(pool._ready.queue)
    try:
        pool.close()
        for p in procs:
            p.wait(timeout=5)
        # every stage of every pooled process ended, not only the script
        assert [p.pid for p in procs if not _ended(p.pid)] == []
    finally:
        for p in procs:
            if _group_alive(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
