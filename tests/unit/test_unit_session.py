"""StreamSession on fakes of its ports (tests/fakes.py; no models): ordering, slow consumers, clock offsets, the
state machine, degraded classes, the journal during a stream-log outage."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from fakes import FakeOwner, FakePort, drain, session

from lingua_fusion.config import Settings
from lingua_fusion.errors import CapacityExhausted, Overloaded, SlowConsumer
from lingua_fusion.stream.protocol import StreamSpec
from lingua_fusion.stream.session import State


async def test_finals_keep_input_order_even_when_later_work_finishes_first() -> None:
    owner = FakeOwner()
    s = session(owner=owner)
    s.start()
    await s.feed_text("a slow one")
    await s.feed_text("a quick one")
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    assert [(f["seq"], f["text"]) for f in finals] == [(1, "A SLOW ONE"), (2, "A QUICK ONE")]
    assert s.state == State.CLOSED and s.spec.stream_id in owner.released_ids


async def test_a_client_that_stops_reading_is_closed_not_buffered() -> None:
    s = session(max_events=3)
    s.start()
    for i in range(6):
        await s.feed_text(f"line {i}")
    await asyncio.wait_for(s.closed.wait(), timeout=5)
    assert isinstance(s.error, SlowConsumer) and s.error.code == "slow_consumer"
    assert s.events.qsize() <= 3  # the queue never grew past its bound
    with pytest.raises(Exception, match="not live"):
        await s.feed_text("after close")


async def test_clock_offsets_place_text_on_the_audio_clock() -> None:
    s = session(spec=StreamSpec(source_lang="en", targets=["es"], clock_offsets={"text": -0.5}))
    s.start()
    s.timeline.write(__import__("numpy").zeros(16000 * 2, dtype="float32"), 10.0)  # audio clock: 10.0 -> t=0
    await s.feed_text("hello", ts=11.5)
    await s.end()
    final = next(e for e in await drain(s) if e["type"] == "final")
    assert final["start"] == pytest.approx(1.0)  # 11.5 - 0.5 (skew) - 10.0 (origin)


def test_illegal_state_transition_raises() -> None:
    s = session()
    s.state = State.CLOSED
    with pytest.raises(RuntimeError, match="illegal transition"):
        s._to(State.LIVE)


async def test_a_degraded_class_reads_fewer_frames_then_none() -> None:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 32), "white").save(buf, "PNG")
    port, owner = FakePort(), FakeOwner()
    owner.steps = {"drop_partials", "lower_frame_rate"}  # breaker level 2
    s = session(port, owner)
    s.start()
    s.timeline.origin = 0.0
    for ts in (0.0, 1.0, 2.0, 6.0, 7.0):  # one frame per second of stream time
        await s.feed_image(buf.getvalue(), ts)
    await asyncio.gather(*s._tasks)  # the frames that were taken are read
    assert port.count("ocr") == 2 and s.frames_dropped == 3  # lower_frame_rate: one frame per 5 s read
    owner.steps.add("skip_vision")  # level 3: no frame is read
    await s.feed_image(buf.getvalue(), 20.0)
    await asyncio.gather(*s._tasks)
    assert port.count("ocr") == 2 and s.frames_dropped == 4
    await s.end()
    closed = (await drain(s))[-1]
    assert closed["frames_dropped"] == 4


class FlakyStore:
    """A real SQLite stream log that can be switched to failing (Redis down) or to having lost the stream."""

    def __init__(self, path: Any) -> None:
        from lingua_fusion.state.streams import SQLiteStreamStore

        self.real = SQLiteStreamStore(path)
        self.down = False
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        from lingua_fusion.errors import BackendError, NotFound

        fn = getattr(self.real, name)

        def call(*args: Any) -> Any:
            if self.lost and name == "append_final":
                raise NotFound("no such stream")
            if self.down:
                raise BackendError("store down")
            return fn(*args)

        return call


async def test_finals_sent_during_an_outage_are_logged_even_after_the_stream_closed(tmp_path: Any) -> None:
    store = FlakyStore(tmp_path)
    settings = Settings()
    settings.state.log_wait_s = 0.1
    s = session(store=store, settings=settings)
    log = s.journal.log  # type: ignore[union-attr]
    await s.open()
    await s.feed_text("one", 1.0)
    assert s.journal is not None
    async with s.journal._progress:  # "one" is logged before the log goes down
        await asyncio.wait_for(s.journal._progress.wait_for(lambda: s.journal.logged_seq >= 1), 5)
    store.down = True  # the log goes down: the next finals go out before they are logged
    await s.feed_text("two", 2.0)
    await s.feed_text("three", 3.0)
    events = []
    while len([e for e in events if e["type"] == "final"]) < 3:
        events.append((await asyncio.wait_for(s.events.get(), timeout=5)).to_wire())
    finals = [e for e in events if e["type"] == "final"]
    assert "durable" not in finals[0] and finals[1]["durable"] is False and finals[2]["durable"] is False
    assert any(e["type"] == "not_durable" and e["from_seq"] == 2 for e in events)
    s.abort()  # the client went away while the log was down
    writer = log._orphans.get(s.spec.stream_id)
    assert writer is not None and not writer.done()  # the writer was handed over, not cancelled
    store.down = False
    await asyncio.wait_for(log.settled(s.spec.stream_id), timeout=10)
    assert [e["seq"] for e in store.real.finals_after(s.spec.stream_id, 0)] == [1, 2, 3]
    snap = store.real.resume(s.spec.stream_id, s.spec.resume_token)
    assert snap["text_until"] == 2.0 and snap["committed_until"] == 0.0  # text (3.0 - origin 1.0) has its own cursor


async def test_a_stream_the_log_lost_stops_retrying(tmp_path: Any) -> None:
    store = FlakyStore(tmp_path)
    settings = Settings()
    settings.state.log_wait_s = 0.1
    s = session(store=store, settings=settings)
    await s.open()
    store.lost = True  # compacted away, or a Redis that came back empty
    await s.feed_text("one", 1.0)
    events = [(await asyncio.wait_for(s.events.get(), timeout=5)).to_wire() for _ in range(3)]
    assert s.journal is not None and s.journal._writer is not None
    await asyncio.wait_for(s.journal._writer, 5)  # the writer gave up on its own: no endless retries
    assert s.journal.pending == 0
    assert any(e["type"] == "error" and e["code"] == "not_found" for e in events), events
    assert next(e for e in events if e["type"] == "final")["durable"] is False
    s.abort()


async def test_a_resumed_stream_drops_text_it_had_already_logged() -> None:
    s = session(resume={"last_seq": 2, "committed_until": 0.0, "origin": 0.0, "text_until": 6.0})
    s.start()
    for ts, text in ((3.0, "old one"), (6.0, "old two"), (6.0004, "new one"), (9.0, "new two")):
        await s.feed_text(text, ts)
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    assert [(f["seq"], f["text"]) for f in finals] == [(3, "NEW ONE"), (4, "NEW TWO")]


@pytest.mark.parametrize("error", [Overloaded("the queue is full"), CapacityExhausted("the GPU pool is full")])
async def test_a_partial_whose_model_work_is_refused_is_dropped_not_raised(error: Exception) -> None:
    """A tentative re-decode that the engine refuses (queue or GPU pool full) shows no partial; nothing escapes
    into the stream's tasks."""
    from lingua_fusion.stream.jobs import Shed, StreamJobs

    class Refusing:
        async def run(self, key: Any, payload: Any, ctx: Any) -> Any:
            assert ctx.tentative
            raise error

    jobs = StreamJobs(StreamSpec(source_lang="en", targets=["es"]), Refusing())  # type: ignore[arg-type]
    assert isinstance(await jobs.partial(np.zeros(16000, dtype=np.float32), lambda: True), Shed)  # the pacer backs off


async def test_a_cancelled_reader_of_the_outbox_leaves_no_task_behind() -> None:
    """The WebSocket writer is cancelled when its client leaves mid-stream; the outbox's two waiters (the queue's
    get, the closed event's wait) used to stay pending and be garbage-collected later ("Task was destroyed but it
    is pending!" in the server log, once per abandoned stream). Events still queued are not lost to it."""
    from lingua_fusion.stream.events import error_event
    from lingua_fusion.stream.session import Outbox

    outbox = Outbox(8, full=lambda: None)
    closed = asyncio.Event()
    seen: list[str] = []

    async def read() -> None:
        async for event in outbox.outgoing(closed, lambda: None):
            seen.append(event.TYPE)

    reader = asyncio.create_task(read())
    outbox.emit(error_event(Overloaded("one")))
    for _ in range(20):
        if seen:
            break
        await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert seen == ["error"]
    outbox.emit(error_event(Overloaded("two")))  # queued after the reader left: a new reader gets it
    closed.set()
    assert [e.TYPE async for e in outbox.outgoing(closed, lambda: None)] == ["error"]


async def test_a_bug_in_a_captions_work_is_told_to_the_client_not_a_quiet_end(
        caplog: pytest.LogCaptureFixture) -> None:
    """An error no stage typed (a bug: under ``serve --workers`` a text the model wire could not encode did this)
    used to end the emitter silently: no ``closed``, no error, a WebSocket close 1000, and 'Task exception was
    never retrieved'. The client now gets ``error`` ``internal`` (1011 on the wire) and the server log says why."""
    from lingua_fusion.errors import LinguaFusionError

    def bug(key: Any, payload: Any) -> Any:
        if key.task == "mt" and "bad" in payload.text:
            raise TypeError("a bug")
        return None

    s = session(FakePort(on_call=bug))
    s.start()
    for text in ("one good", "bad one", "three good"):
        await s.feed_text(text)
    await s.end()
    events = [e.to_wire() async for e in s.outgoing()]
    assert [(e["type"], e.get("seq")) for e in events if e["type"] != "metrics"] == [("final", 1), ("error", None)]
    assert events[-1]["code"] == "internal" and "a bug" not in events[-1]["message"]  # the details stay in the log
    assert type(s.error) is LinguaFusionError and s.state == State.CLOSED
    assert any("its finals failed" in r.getMessage() for r in caplog.records)


class _Clock:
    """The test's clock: the audio feed moves it, a slow model call waits for it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._moved = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._moved.set()
        self._moved = asyncio.Event()

    async def until(self, t: float) -> None:
        while self.now < t:
            await self._moved.wait()


class _SlowPartials(FakePort):
    """Tentative ASR comes back ``latency`` seconds later on the test's clock; ``shed``: at once, shed (None)."""

    def __init__(self, clock: _Clock, latency: float, shed: bool = False) -> None:
        super().__init__()
        self.clock, self.latency, self.shed = clock, latency, shed

    async def run_untyped(self, key: Any, payload: object, ctx: Any) -> object:
        if key.task == "asr" and ctx.tentative:
            if self.shed:
                self.calls.append((key, payload, ctx))
                return None
            await self.clock.until(self.clock() + self.latency)
        return await super().run_untyped(key, payload, ctx)


async def _partials_heard(latency: float, shed: bool = False) -> tuple[int, int]:
    """5.5 s of speech fed in real time on the test's clock: (partial re-decodes started, finals)."""
    clock = _Clock()
    port = _SlowPartials(clock, latency, shed)
    s = session(port, spec=StreamSpec(source_lang="en", targets=["es"], slo="interactive"), clock=clock)
    s.start()
    speech = (np.full(1600, 0.5) * 32767).astype("<i2").tobytes()  # 0.1 s
    for chunk in [speech] * 55 + [bytes(3200)] * 10:
        clock.advance(0.1)
        await s.feed_audio(chunk)
        await asyncio.sleep(0.005)
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    return sum(1 for k, _, ctx in port.calls if k.task == "asr" and ctx.tentative), len(finals)


async def test_partials_back_off_while_the_engine_is_slow_and_captions_do_not() -> None:
    """Partials are the first work dropped under load: a stream whose partials take 1 s to come back asks for one
    every 2.5 s instead of one each time the last is back (5 in 5.5 s); a fast engine still gets one every 0.5 s.
    The committed caption is there either way."""
    fast, fast_finals = await _partials_heard(0.02)
    slow, slow_finals = await _partials_heard(1.0)
    assert fast >= 9 and fast_finals == 1
    assert slow <= 3 and slow_finals == 1


async def test_partials_the_engine_sheds_at_once_are_asked_for_less_not_more() -> None:
    """A full queue answers a partial in no time with nothing: the stream backs off (hops of 1, 2, 4 s), where a
    fast round trip would have had it ask every step (11 in 5.5 s)."""
    shed, finals = await _partials_heard(0.0, shed=True)
    assert shed <= 4 and finals == 1
