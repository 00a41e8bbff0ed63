"""One StreamService for every stream: an in-process stream (``MultimodalTranslator.local().stream``) and a
WebSocket stream get the same breaker notices, the same shedding and the same drain, seen on the wire.

The breaker is driven through the service's own entry point for caption latencies, with a clock the test moves,
so each window closes when the test says; models are real (Apertium translates the text that is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from conftest import REDIS, free_port, needs_redis

from lingua_fusion.api import create_app
from lingua_fusion.config import Settings
from lingua_fusion.errors import Overloaded
from lingua_fusion.sdk.local import LocalTranslator
from lingua_fusion.stream.breaker import STEPS
from lingua_fusion.stream.service import StreamService
from lingua_fusion.stream.supervisor import BreakerSupervisor


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def settings_for(tmp: Path) -> Settings:
    s = Settings(state_dir=tmp)
    s.server.auth = False
    s.server.breaker_window_s = 1.0
    s.server.breaker_k = 1  # one breached window moves the class one step
    return s


def start(importance: float) -> dict[str, Any]:
    return {"type": "start", "source_lang": "en", "target_langs": ["es"], "slo": "standard", "partials": False,
            "importance": importance, "inputs": ["text"]}


class Wire:
    """One stream's events as its client receives them, and how it ended."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    async def add(self, event: dict[str, Any]) -> None:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    async def until(self, pred: Any, wait_s: float = 20.0) -> dict[str, Any]:
        async with asyncio.timeout(wait_s), self._changed:
            await self._changed.wait_for(lambda: any(pred(e) for e in self.events))
            return next(e for e in self.events if pred(e))

    def types(self) -> list[str]:
        return [e["type"] + (":" + e["code"] if e["type"] == "error" else "") for e in self.events]


async def open_local(translator: LocalTranslator, msg: dict[str, Any]) -> tuple[Wire, Any]:
    stream = translator.stream(msg["target_langs"], source_lang="en", slo=msg["slo"], partials=False,
                               importance=msg["importance"], inputs=msg["inputs"])
    await stream.__aenter__()
    wire = Wire()
    wire.events.append(stream.ready)

    async def read() -> None:
        async for ev in stream:
            await wire.add(ev.model_dump(exclude_none=True))

    wire.task = asyncio.create_task(read())
    return wire, stream.send_text


async def open_ws(url: str, msg: dict[str, Any]) -> tuple[Wire, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    ws = await connect(url, open_timeout=10)
    await ws.send(json.dumps(msg))
    wire = Wire()

    async def read() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in ws:
                await wire.add(json.loads(raw))
        wire.close_code = ws.close_code

    async def send_text(text: str, ts: float) -> None:
        await ws.send(json.dumps({"type": "text", "text": text, "ts": ts}))

    wire.task = asyncio.create_task(read())
    return wire, send_text


async def scenario(service: StreamService, opener: Any) -> tuple[Wire, Wire]:
    clock = Clock()
    service.executor.clock = clock
    low, _ = await opener(start(0.2))
    high, send_high = await opener(start(0.8))
    await low.until(lambda e: e["type"] == "ready")
    await high.until(lambda e: e["type"] == "ready")
    service.caption_done("standard", 30.0)  # 10x the class's 3 s target
    for _ in STEPS:  # each closed window breaches: one step down the ladder per window
        clock.t += 1.0
        service.caption_done("standard", 30.0)
    await low.until(lambda e: e["type"] == "error")
    await high.until(lambda e: e["type"] == "degraded" and e["level"] == len(STEPS))
    await send_high("The dog is black.", 0.0)
    await high.until(lambda e: e["type"] == "final")
    await service.drain(5.0)
    await high.until(lambda e: e["type"] == "error")
    for w in (low, high):
        assert w.task is not None
        await asyncio.wait_for(w.task, 10)
    return low, high


def check(low: Wire, high: Wire) -> None:
    ladder = [("degraded", i + 1, step) for i, step in enumerate(STEPS)]
    for w in (low, high):
        got = [(e["type"], e["level"], e["step"]) for e in w.events if e["type"] == "degraded"]
        assert got == (ladder if w is high else ladder[: len(got)]) and got, w.events
    shed = next(e for e in low.events if e["type"] == "error")
    assert shed["code"] == "overloaded" and "shed" in shed["message"]
    assert not any(e["type"] == "final" for e in low.events)
    final = next(e for e in high.events if e["type"] == "final")
    assert final["seq"] == 1 and final["text"] == "El perro es negro."
    assert high.types()[-1] == "error:draining" and "reconnect" in high.events[-1]["message"]


async def test_in_process_stream_gets_breaker_notices_shedding_and_drain(tmp_path: Path) -> None:
    translator = LocalTranslator(settings_for(tmp_path))
    service = translator.streams()
    try:
        low, high = await scenario(service, lambda msg: open_local(translator, msg))
    finally:
        await translator.close_streams()
        translator.close()
    check(low, high)
    assert service.sessions == {}  # both released


async def test_websocket_stream_gets_the_same(tmp_path: Path) -> None:
    app = create_app(settings_for(tmp_path), warm=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers no event for it)
                await asyncio.sleep(0.05)
        service: StreamService = app.state.streams
        low, high = await scenario(service, lambda msg: open_ws(f"ws://127.0.0.1:{port}/v1/streams", msg))
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
    check(low, high)
    assert low.close_code == 4429 and high.close_code == 1012  # shed: don't retry here; draining: resume


async def test_a_failed_stream_frees_its_quota_and_admission(tmp_path: Path) -> None:
    translator = LocalTranslator(settings_for(tmp_path))
    service = translator.streams()
    try:
        wire, _ = await open_local(translator, start(0.5))
        await wire.until(lambda e: e["type"] == "ready")
        assert len(service.sessions) == 1 and service.quota.open["local"] == 1
        assert len(service.executor.scheduler.admitted) == 1
        next(iter(service.sessions.values())).fail(Overloaded("shed"))
        await wire.until(lambda e: e["type"] == "error")
        assert service.sessions == {} and service.quota.open["local"] == 0
        assert service.executor.scheduler.admitted == {}
    finally:
        await translator.close_streams()
        translator.close()


@contextlib.asynccontextmanager
async def two_servers(settings: Settings) -> AsyncIterator[tuple[list[Any], str, str]]:
    """Two servers in this process on one state directory (one stream store), like the workers of ``serve
    --workers 2``: their apps and their /v1/streams URLs."""
    apps = [create_app(settings, warm=False) for _ in range(2)]
    servers = [uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                             lifespan="on")) for app in apps]
    serving = [asyncio.create_task(s.serve()) for s in servers]
    try:
        async with asyncio.timeout(30):
            while not all(s.started for s in servers):  # noqa: ASYNC110 (uvicorn offers no event for it)
                await asyncio.sleep(0.05)
        url_a, url_b = (f"ws://127.0.0.1:{s.config.port}/v1/streams" for s in servers)
        yield apps, url_a, url_b
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.wait_for(asyncio.gather(*serving), 30)


async def captioning(url: str) -> tuple[Any, Any, dict[str, Any]]:
    """A stream opened on ``url`` with one caption ("One.") final: its events, its sender, its ``ready``."""
    first, send_first = await open_ws(url, start(0.5))
    ready = await first.until(lambda e: e["type"] == "ready")
    await send_first("One.", 1.0)
    await first.until(lambda e: e["type"] == "final")
    return first, send_first, ready


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=needs_redis)])
async def test_a_stream_resumed_on_another_server_takes_it_over(kind: str, tmp_path: Path) -> None:
    """Two servers (like the worker processes of ``serve --workers 2``) share one stream store. A stream resumed on
    the second while its first connection is still open is taken over: the first connection ends ``taken_over``
    (4409) at its next caption instead of logging it, and the log holds exactly the second connection's finals
    after the resume point (before, both logged finals under the same seq and the second one's were lost)."""
    settings = settings_for(tmp_path)
    if kind == "redis":
        settings.state.redis_url = REDIS
    async with two_servers(settings) as (apps, url_a, url_b):
        first, send_first, ready = await captioning(url_a)
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 1}}
        second, send_second = await open_ws(url_b, resume)
        await second.until(lambda e: e["type"] == "ready")
        await send_first("Two from the first.", 2.0)
        await send_second("Three from the second.", 3.0)
        await first.until(lambda e: e["type"] == "error")
        assert first.task is not None
        await asyncio.wait_for(first.task, 10)
        await send_second("Five from the second.", 5.0)
        await second.until(lambda e: e["type"] == "final" and e["seq"] == 3)
        replay = {"type": "start", "resume": {**resume["resume"], "last_seq": 0}}
        third, _ = await open_ws(url_a, replay)
        await third.until(lambda e: e["type"] == "final" and e["seq"] == 3)
    assert [(e["seq"], e["source_text"]) for e in first.events if e["type"] == "final"] == [(1, "One.")]
    assert first.types()[-1] == "error:taken_over" and first.close_code == 4409
    got = [(e["seq"], e["source_text"]) for e in second.events if e["type"] == "final"]
    assert got == [(2, "Three from the second."), (3, "Five from the second.")]
    logged = [(e["seq"], e["source_text"]) for e in third.events if e["type"] == "final"]
    assert logged == [(1, "One."), *got]


async def test_a_resume_refused_by_a_draining_server_does_not_take_the_stream_over(tmp_path: Path) -> None:
    """A resume sent to a server that is shutting down is refused (overloaded, 4429: connect again) before it
    claims the stream: the stream's live connection on the other server keeps it and goes on captioning (before,
    the refused resume claimed it first, and that healthy connection ended taken_over at its next caption)."""
    settings = settings_for(tmp_path)
    async with two_servers(settings) as (apps, url_a, url_b):
        first, send_first, ready = await captioning(url_a)
        apps[1].state.streams.draining = True  # server B has begun its drain
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 1}}
        refused, _ = await open_ws(url_b, resume)
        assert refused.task is not None
        await asyncio.wait_for(refused.task, 10)
        assert refused.types()[-1] == "error:overloaded" and refused.close_code == 4429
        # counted as a server not serving now, not as a full one
        counts = apps[1].state.metrics.registry.get_sample_value
        assert counts("linguafusion_streams_unavailable_total") == 1
        assert counts("linguafusion_streams_rejected_total") == 0
        await send_first("Two.", 2.0)
        await first.until(lambda e: e["type"] == "final" and e["seq"] == 2)
    assert "error:taken_over" not in first.types()


CAPS = {"total": ("max_streams", 1), "per_key": ("max_streams_per_key", 1)}


@pytest.mark.parametrize(("kind", "cap"), [("sqlite", "total"), ("sqlite", "per_key"),
                                           pytest.param("redis", "total", marks=needs_redis)])
async def test_a_resume_refused_for_capacity_does_not_take_the_stream_over(kind: str, cap: str,
                                                                           tmp_path: Path) -> None:
    """Server B is full (one stream allowed, in all or for the key, and another stream holds it). A resume there of
    a stream live on server A is refused (overloaded, 4429) before it claims the stream: the connection on A keeps
    it and goes on captioning the text it sends (before, the refused resume had claimed the stream first, and the
    healthy connection on A ended taken_over at its next caption although the refusal said nothing happened)."""
    settings = settings_for(tmp_path)
    setattr(settings.server, *CAPS[cap])
    if kind == "redis":
        settings.state.redis_url = REDIS
    async with two_servers(settings) as (apps, url_a, url_b):
        first, send_first, ready = await captioning(url_a)
        other, _ = await open_ws(url_b, start(0.5))  # fills server B
        await other.until(lambda e: e["type"] == "ready")
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 1}}
        refused, _ = await open_ws(url_b, resume)
        assert refused.task is not None
        await asyncio.wait_for(refused.task, 10)
        assert refused.types() == ["error:overloaded"] and refused.close_code == 4429
        await send_first("Two.", 2.0)
        second = await first.until(lambda e: e["type"] in ("error", "final") and e.get("seq") != 1)
        assert second.get("seq") == 2 and second.get("text") == "Dos.", first.events
        assert list(apps[0].state.streams.sessions) == [ready["stream_id"]]
    assert "error:taken_over" not in first.types()
    assert not any(e["type"] == "ready" for e in refused.events)


class _BothClaimsInFlight:
    """The real SQLite stream store; ``claim`` returns only once two resumes are claiming at the same time (the
    window two reconnects of one client hit when the store is slow)."""

    def __init__(self, real: Any) -> None:
        import threading

        self.real = real
        self.together = threading.Barrier(2, timeout=10)

    def claim(self, stream_id: str, token: str) -> dict[str, Any]:
        self.together.wait()
        return self.real.claim(stream_id, token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_two_concurrent_resumes_on_one_server_leave_one_live_session(tmp_path: Path) -> None:
    """Two resumes of one stream on one server, both past the 'is an older session here?' check before either is
    registered: the newer claim keeps the stream, the other ends taken_over, and the key's quota is all given back
    when the stream ends (before, both went live, the one left out of the service's sessions was never told, and
    its quota slot stayed taken)."""
    from lingua_fusion.errors import TakenOver
    from lingua_fusion.serving.executor import Executor
    from lingua_fusion.state.streams import SQLiteStreamStore
    from lingua_fusion.stream.journal import StreamLog
    from lingua_fusion.stream.service import Principal

    settings = settings_for(tmp_path)
    translator = LocalTranslator(settings)
    store = _BothClaimsInFlight(SQLiteStreamStore(tmp_path))
    log = StreamLog(store)
    breakers = BreakerSupervisor(settings)
    service = StreamService(Executor(translator.engine.registry, settings, observer=breakers), settings,
                            supervisor=breakers, log=log)
    who = Principal("key_a")
    try:
        first = await service.open(start(0.5), who)
        ready = first.greeting[0].to_wire()
        first.session.abort()  # the connection broke
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 0}}
        outcomes = await asyncio.gather(service.open(resume, who), service.open(resume, who), return_exceptions=True)
        live = [o.session for o in outcomes if not isinstance(o, BaseException) and o.session.error is None]
        ended = [o for o in outcomes if isinstance(o, TakenOver)
                 or (not isinstance(o, BaseException) and isinstance(o.session.error, TakenOver))]
        assert len(live) == 1 and len(ended) == 1, outcomes
        assert service.sessions == {ready["stream_id"]: live[0]}
        assert live[0].journal is not None and live[0].journal.epoch == 2  # the newer claim
        live[0].abort()
        assert service.quota.open["key_a"] == 0
    finally:
        await service.close()
        await service.executor.close()
        await log.close()
        translator.close()


@contextlib.asynccontextmanager
async def local_service(settings: Settings, store: Any = None) -> AsyncIterator[StreamService]:
    """A StreamService on the real executor and a SQLite stream store (``store`` wraps it when given)."""
    from lingua_fusion.serving.executor import Executor
    from lingua_fusion.state.streams import SQLiteStreamStore
    from lingua_fusion.stream.journal import StreamLog

    translator = LocalTranslator(settings)
    real = SQLiteStreamStore(settings.state_dir)
    log = StreamLog(real if store is None else store(real))
    breakers = BreakerSupervisor(settings)
    service = StreamService(Executor(translator.engine.registry, settings, observer=breakers), settings,
                            supervisor=breakers, log=log)
    try:
        yield service
    finally:
        await service.close()  # the service closes only what it made: the engine and the log are ours
        await service.executor.close()
        await log.close()
        translator.close()


@pytest.mark.parametrize("cap", ["per_key", "total"])
async def test_a_takeover_on_a_full_server_needs_no_capacity_of_its_own(cap: str, tmp_path: Path) -> None:
    """A resume of a stream live on this server replaces its connection; it does not add a stream, so a full
    server (its total, or the resuming key's quota) does not refuse it: the new session has the stream, the old one
    ends taken_over, and the counts are what they were (before, the old session was ended first and an admin
    key at its own quota resuming another key's stream was then refused: the stream was lost to both)."""
    from lingua_fusion.errors import TakenOver
    from lingua_fusion.stream.service import Principal

    settings = settings_for(tmp_path)
    setattr(settings.server, *CAPS[cap] if cap == "per_key" else ("max_streams", 2))
    owner, admin = Principal("key_a"), Principal("key_admin", admin=True)
    async with local_service(settings) as service:
        first = await service.open(start(0.5), owner)
        ready = first.greeting[0].to_wire()
        await service.open(start(0.5), admin)  # the server (cap 2) and the admin key (cap 1) are full now
        with pytest.raises(Overloaded):
            await service.open(start(0.5), admin)
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 0}}
        resumed = await service.open(resume, admin)
        assert resumed.greeting[0].to_wire()["resumed"] is True and resumed.session.error is None
        assert isinstance(first.session.error, TakenOver)
        assert service.sessions[ready["stream_id"]] is resumed.session
        assert service.quota.open == {"key_a": 1, "key_admin": 1}
        assert len(service.executor.scheduler.admitted) == 2
        resumed.session.abort()
        assert service.quota.open == {"key_a": 0, "key_admin": 1}
        assert len(service.executor.scheduler.admitted) == 1


class _DrainDuringClaim:
    """The real SQLite stream store; its ``claim`` starts the service's drain (the drain begins while a resume waits
    on the store)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.service: StreamService | None = None

    def claim(self, stream_id: str, token: str) -> dict[str, Any]:
        assert self.service is not None
        self.service.draining = True
        return self.real.claim(stream_id, token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_resume_that_claimed_the_stream_before_a_drain_is_closed_draining_not_refused(
        tmp_path: Path) -> None:
    """A drain that begins after a resume claimed the stream cannot refuse it any more (the old connection was
    told taken_over; a refusal would leave the stream with nobody): the resume gets its ``ready`` and then
    ``draining`` (1012: resume elsewhere), and lets go of its quota (before, it was refused as overloaded, 4429)."""
    from lingua_fusion.errors import Draining
    from lingua_fusion.stream.service import Principal

    wrapped: list[_DrainDuringClaim] = []

    def wrap(real: Any) -> _DrainDuringClaim:
        wrapped.append(_DrainDuringClaim(real))
        return wrapped[0]

    who = Principal("key_a")
    async with local_service(settings_for(tmp_path), wrap) as service:
        wrapped[0].service = service
        first = await service.open(start(0.5), who)
        ready = first.greeting[0].to_wire()
        first.session.abort()  # the connection broke
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 0}}
        resumed = await service.open(resume, who)
        assert resumed.greeting[0].to_wire()["resumed"] is True
        assert isinstance(resumed.session.error, Draining)
        assert service.sessions == {} and service.quota.open == {"key_a": 0}


class _SlowOpen:
    """The real SQLite stream store, whose recording of a new stream waits until the test lets it go (a busy
    disk)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.started, self.release = threading.Event(), threading.Event()

    def open_stream(self, *args: Any) -> Any:
        self.started.set()  # on the log's thread
        self.release.wait(timeout=10)
        return self.real.open_stream(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_stream_ended_while_it_opens_is_refused_with_the_reason_not_an_internal_error(tmp_path: Path) -> None:
    """A drain (or a revoked key, or shedding) ends a stream while its start waits on the stream log: the open
    raises that reason (draining: 1012, reconnect), and the stream's quota slot is given back. Before, going live
    after being closed raised RuntimeError('illegal transition CLOSED -> LIVE'): the client read 1011 internal
    and the log a traceback (found by an attack)."""
    from lingua_fusion.errors import Draining
    from lingua_fusion.stream.service import Principal

    who = Principal("key_a")
    stores: list[_SlowOpen] = []
    async with local_service(settings_for(tmp_path), lambda real: stores.append(_SlowOpen(real)) or stores[0]) \
            as service:
        opening = asyncio.create_task(service.open(start(0.5), who))
        assert await asyncio.to_thread(stores[0].started.wait, 10)  # registered, now waiting on the log
        next(iter(service.sessions.values())).fail(Draining("the server is shutting down (the test's)"))
        stores[0].release.set()
        with pytest.raises(Draining):
            await asyncio.wait_for(opening, timeout=10)
        assert service.sessions == {} and service.quota.open == {"key_a": 0}


async def test_a_stream_resumed_by_an_admin_key_still_counts_against_its_own_key(tmp_path: Path) -> None:
    """An admin key that resumes another key's stream holds it within that key's cap: the key cannot open one
    stream more meanwhile. Before, the resume was charged to the admin key, and the owner, at its cap of 1, opened a
    second stream and then took the first back: two live streams (found by an attack)."""
    from lingua_fusion.stream.service import Principal

    settings = settings_for(tmp_path)
    setattr(settings.server, *CAPS["per_key"])
    owner, admin = Principal("key_a"), Principal("key_admin", admin=True)
    async with local_service(settings) as service:
        first = await service.open(start(0.5), owner)
        ready = first.greeting[0].to_wire()
        first.session.abort()  # its connection broke
        resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                              "last_seq": 0}}
        await service.open(resume, admin)
        assert service.quota.open.get("key_a") == 1 and service.quota.open.get("key_admin", 0) == 0
        with pytest.raises(Overloaded):
            await service.open(start(0.5), owner)
