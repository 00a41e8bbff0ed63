"""The engine's StageObserver is given at construction, never patched in afterwards (serving/engine.py): whoever
builds the engine makes the streams' BreakerSupervisor first (stream/supervisor.py), hands it to the engine's
constructor (``observer=``) and to the StreamService (``supervisor=``). The service never writes to the engine."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from lingua_fusion.config import Settings
from lingua_fusion.serving.engine import Engine
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import FILE_CLASS, CallContext, MtInput
from lingua_fusion.serving.shard.remote import RemotePort
from lingua_fusion.stream.service import StreamService
from lingua_fusion.stream.supervisor import BreakerSupervisor

pytestmark = pytest.mark.timeout(30)
MT = ModelKey.mt("en", "es")


class Heard(BreakerSupervisor):
    """The real supervisor, with what it was told kept."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.heard: list[tuple[str, str, str, float]] = []

    def record(self, slo: str, seconds: float, stage: str, key_id: str) -> None:
        self.heard.append((slo, stage, key_id, seconds))
        super().record(slo, seconds, stage, key_id)


def _settings(tmp_path: Any) -> Settings:
    settings = Settings()
    settings.state_dir = tmp_path
    settings.server.breaker_window_s = 1.0
    settings.server.breaker_k = 1
    return settings


class Sealed:
    """An engine that takes no new attribute (``__slots__``): the service may read it, never write to it."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_the_engine_built_with_the_supervisor_feeds_the_services_breakers(tmp_path: Any) -> None:
    """Committed stream work's stage latency reaches the supervisor the engine was built with, which is the one the
    StreamService uses: 30 s MT items (on the engine's clock) move the standard class's breaker down. Tentative and
    file work report nothing."""
    settings = _settings(tmp_path)
    t = [1000.0]
    lock = threading.Lock()

    def runner(items: list[Any]) -> list[str]:
        with lock:
            t[0] += 30.0  # each batch takes 30 s on the engine's clock: 10x the standard class's target
        return [it.text for it in items]

    breakers = Heard(settings)
    executor = Executor(None, settings, clock=lambda: t[0], observer=breakers,  # type: ignore[arg-type]
                        backends={"mt": lambda _key: runner})
    service = StreamService(executor, settings, supervisor=breakers)
    try:
        assert service.supervisor is breakers
        await executor.run(MT, MtInput("tentative"), CallContext("s1", key_id="k1", tentative=True))
        await executor.run(MT, MtInput("a file's piece"), CallContext("file:1", slo=FILE_CLASS, key_id="k1"))
        assert breakers.heard == []
        for text in ("one", "two"):
            assert await executor.run(MT, MtInput(text), CallContext("s1", key_id="k1")) == text
        assert [h[:3] for h in breakers.heard] == [("standard", "mt", "k1")] * 2
        assert all(h[3] >= 30.0 for h in breakers.heard)
        assert service.breaker.level("standard") == 1  # the first window breached (k = 1): the service's breaker
    finally:
        await service.close()
        await executor.close()


async def test_the_per_stream_baseline_reports_nothing(tmp_path: Any) -> None:
    settings = _settings(tmp_path)

    def runner(items: list[Any]) -> list[str]:
        return [it.text for it in items]

    breakers = Heard(settings)
    executor = Executor(None, settings, mode="per-stream", observer=breakers,  # type: ignore[arg-type]
                        backends={"mt": lambda _key: runner})
    service = StreamService(executor, settings, supervisor=breakers)
    try:
        assert await executor.run(MT, MtInput("hello"), CallContext("s1", key_id="k1")) == "hello"
        assert breakers.heard == []
    finally:
        await service.close()
        await executor.close()


async def test_the_service_writes_nothing_to_its_engine(tmp_path: Any) -> None:
    """A StreamService on an engine that takes no attribute: it is built, and its supervisor reads the service's
    live streams and the engine's clock (bound once, ``watch``)."""
    settings = _settings(tmp_path)
    inner = Executor(None, settings, clock=lambda: 42.0)  # type: ignore[arg-type]
    engine = Sealed(inner)
    with pytest.raises(AttributeError):
        engine.observer = object()  # type: ignore[attr-defined]  # what the old service did
    breakers = BreakerSupervisor(settings)
    service = StreamService(engine, settings, supervisor=breakers)  # type: ignore[arg-type]
    try:
        assert breakers.clock() == 42.0  # the engine's clock ...
        inner.clock = lambda: 43.0
        assert breakers.clock() == 43.0  # ... read when needed (tests set it after the service is made)
        assert list(breakers.sessions()) == []
        assert breakers.sessions is not None and service.supervisor is breakers
        with pytest.raises(RuntimeError):  # one supervisor, one service
            StreamService(engine, settings, supervisor=breakers)  # type: ignore[arg-type]
    finally:
        await service.close()
        await inner.close()


def test_the_engine_face_has_no_settable_observer() -> None:
    assert "observer" not in Engine.__annotations__
    assert "observer" not in dir(Engine)


class _Link:
    """A ModelLink whose model process answers every call at once."""

    async def call(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"value": "hola", "depth": 1}


async def test_a_remote_port_reports_to_the_observer_it_was_built_with(tmp_path: Any) -> None:
    settings = _settings(tmp_path)
    breakers = Heard(settings)
    port = RemotePort(_Link(), None, settings, observer=breakers)  # type: ignore[arg-type]
    try:
        assert await port.run(MT, MtInput("hello"), CallContext("s1", key_id="k1")) == "hola"
        assert await port.run(MT, MtInput("hello"), CallContext("s1", key_id="k1", tentative=True)) == "hola"
        assert await port.run(MT, MtInput("hello"), CallContext("f", slo=FILE_CLASS, key_id="k1")) == "hola"
        assert [h[:3] for h in breakers.heard] == [("standard", "mt", "k1")]
        per_stream = RemotePort(_Link(), None, settings, mode="per-stream", observer=breakers)  # type: ignore[arg-type]
        await per_stream.run(MT, MtInput("hello"), CallContext("s1", key_id="k1"))
        assert len(breakers.heard) == 1  # the baseline reports nothing
    finally:
        await breakers.close()
