"""An admin's breaker reset reaches every worker of one server (stream/supervisor.py): each worker has its own
breakers, and the worker that served DELETE /v1/admin/breaker touches a file in the state directory that the
others see at their next tick or their next stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingua_fusion.config import Settings
from lingua_fusion.errors import Overloaded
from lingua_fusion.stream.supervisor import BreakerSupervisor


def _supervisor(state: Path, clock: list[float]) -> BreakerSupervisor:
    settings = Settings()
    settings.state_dir = state
    supervisor = BreakerSupervisor(settings)
    supervisor.watch(lambda: clock[0], lambda: [])
    return supervisor


async def test_a_reset_through_one_worker_restores_another_workers_breakers(tmp_path: Path) -> None:
    clock = [1000.0]
    a, b = _supervisor(tmp_path, clock), _supervisor(tmp_path, clock)
    try:
        for _ in range(40):  # standard captions 10 s late for 20 s: K=3 windows of 5 s breached on worker a
            a.record("standard", 10.0, "caption", "k1")
            clock[0] += 0.5
        with pytest.raises(Overloaded):
            a.refuse_if_breached("standard", "k1", lambda: None)  # k1 misses its target there
        b.announce_restore()  # worker b served the admin's DELETE
        b.restore()
        clock[0] += 0.5
        a.refuse_if_breached("standard", "k1", lambda: None)  # admitted: a saw the marker
        assert a.levels_by_class()["standard"] == 0
        a.refuse_if_breached("standard", "k1", lambda: None)  # and restores once per reset, not at every check
    finally:
        await a.close()
        await b.close()
