"""The serving engine's declared face: what streams (stream/service.py), file requests (files/engine.py through
its ``ModelPort`` part), rooms and the API may use of model serving, and nothing more.

Three implementations, by composition, each checked against this Protocol by mypy where it is built (api/app.py,
api/workers.py, cluster/):
- ``serving/executor.py`` ``Executor``: the scheduler, its steps per model key, the model threads, in process;
- ``serving/shard/remote.py`` ``RemotePort``: the link to a model process (``serve --workers``), where an Executor
  runs every worker's work and decides admission across them;
- ``cluster/port.py`` ``ClusterExecutor``: a local Executor (admission, VAD) and a Serve handle that the rest of
  the work goes through, to the model replicas.

Contract, beside ``ModelPort.run`` and ``depth`` (serving/ports.py):
- ``demand`` is pure: a stream's load per model key, from its languages and inputs; ``reserve`` admits it or
  raises ``Overloaded`` (429) when it would break the admitted streams' SLOs; ``release`` frees it and resolves the
  stream's queued work to ``None``. Every reserve is released once.
- the ``StageObserver`` (serving/ports.py) is given at construction (``observer=``: the SLO breakers' supervisor,
  stream/supervisor.py, made first by whoever builds the engine and handed to the StreamService too) and never set
  afterwards: it is no part of this face. It hears each committed item's stage latency in ``batched`` mode; file
  work (``FILE_CLASS``) and the ``per-stream`` baseline report nothing.
- ``faults`` are the chaos faults in force (``--chaos``; empty where chaos cannot run), ``stuck`` the model calls
  still running past their timeout, by model key (the admin's status page).
- ``registry`` answers routes and model names; under ``--workers`` it loads no model.
- ``close`` ends the timers, model threads and runners the engine started; nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..config import Settings
from ..models.registry import Registry
from .faults import Fault
from .keys import ModelKey
from .ports import ModelPort, StageObserver
from .scheduler import Demand


class Engine(ModelPort, Protocol):
    registry: Registry
    clock: Callable[[], float]

    @property
    def faults(self) -> dict[str, Fault]: ...

    def demand(self, stream_id: str, slo: str, source: str, targets: list[str], partials: bool, step_s: float,
               inputs: list[str], detect: Sequence[str] = (), diarize: bool = False) -> Demand[ModelKey]: ...

    async def reserve(self, demand: Demand[ModelKey], key_id: str = "") -> None: ...

    def release(self, stream_id: str) -> None: ...

    def stuck(self) -> dict[str, int]: ...

    async def close(self) -> None: ...


def in_process(registry: Registry, settings: Settings, *, observer: StageObserver | None = None) -> Engine:
    """The face's in-process implementation (serving/executor.py ``Executor``), for a caller with no server: the
    SDK's local translator (``observer``: its streams' breaker supervisor) and the lab's file engine
    (files/engine.py ``OwnEngine``: none, file work reports nothing)."""
    from .executor import Executor

    return Executor(registry, settings, observer=observer)
