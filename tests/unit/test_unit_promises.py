"""The promises again, one level down, where a fake can make the rare case happen on purpose: a glossary batch that
mixes streams, an engine that loses some placeholders, a queue where everything is late, a stream log that stays
down for 1,000 finals, a store that keeps failing, speech and low-confidence speech in a session (tests/fakes.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import threading
from typing import Any

import numpy as np
import pytest
from fakes import FakeOwner, FakePort, drain, session

from lingua_fusion.config import Settings
from lingua_fusion.errors import LinguaFusionError, NotFound, StoreUnavailable
from lingua_fusion.glossary import Term, apply_mt_batch
from lingua_fusion.serving.ports import AsrOutput
from lingua_fusion.serving.scheduler import CostModel, Scheduler, WorkItem
from lingua_fusion.stream import journal
from lingua_fusion.stream.journal import StoreLink
from lingua_fusion.stream.protocol import StreamSpec

PLACEHOLDER = re.compile(r"\[\d+\]")


# ---- glossaries in a batch of several streams ---------------------------------------------------------------------
def engine(xs: list[str]) -> list[str]:
    """An MT engine: translates 'bank' as 'banco' and 'river' as 'rio', passes placeholders through."""
    return [x.replace("bank", "banco").replace("river", "rio") for x in xs]


BANK = [Term("bank", "orilla")]


@pytest.mark.parametrize("order", ["glossary first", "glossary last"])
def test_each_text_of_a_batch_gets_its_own_glossary(order: str) -> None:
    texts = ["the bank is closed", "the bank is closed"]
    terms: list[list[Term]] = [BANK, []] if order == "glossary first" else [[], BANK]
    outs, applied = apply_mt_batch(texts, terms, engine)
    for out, ts, used in zip(outs, terms, applied, strict=True):
        assert out == ("the orilla is closed" if ts else "the banco is closed")
        assert used == ts


def test_three_streams_with_three_glossaries_in_one_batch() -> None:
    texts = ["the bank", "the bank", "the bank by the river"]
    terms = [[Term("bank", "orilla")], [Term("bank", "ribera")], []]
    outs, applied = apply_mt_batch(texts, terms, engine)
    assert outs == ["the orilla", "the ribera", "the banco by the rio"]
    assert applied == [terms[0], terms[1], []]


def test_when_an_engine_loses_some_placeholders_the_text_is_translated_again_with_the_terms_written_in() -> None:
    calls: list[list[str]] = []

    def lossy(xs: list[str]) -> list[str]:
        calls.append(list(xs))
        out = engine(xs)
        # the first pass mangles one placeholder of the first text only: "[901]" -> "(901)"
        return [re.sub(r"\[(9\d\d)\]", r"(\1)", out[0], count=1), *out[1:]] if len(calls) == 1 else out

    terms = [[Term("bank", "orilla"), Term("river", "corriente")], [Term("bank", "orilla")]]
    outs, applied = apply_mt_batch(["the bank by the river", "the bank"], terms, lossy)
    assert outs[0] == "the orilla by the corriente" and outs[1] == "the orilla"
    assert not any(PLACEHOLDER.search(o) or re.search(r"\(9\d\d\)", o) for o in outs)  # nothing half-replaced
    assert len(calls) == 2 and calls[1] == ["the orilla by the corriente"]  # only the damaged text again
    assert sorted(t.source for t in applied[0]) == ["bank", "river"] and applied[1] == terms[1]


def test_a_retranslation_reports_only_the_terms_that_came_out() -> None:
    def drops_all(xs: list[str]) -> list[str]:
        return [PLACEHOLDER.sub("", x) if "[" in x else x.replace("orilla", "orillas") for x in xs]

    outs, applied = apply_mt_batch(["the bank"], [[Term("bank", "orilla")]], drops_all)
    assert outs == ["the orillas"] and applied == [[Term("bank", "orilla")]]  # "orilla" is in "orillas"
    outs, applied = apply_mt_batch(["the bank"], [[Term("bank", "Ufer")]], lambda xs: [PLACEHOLDER.sub("", x)
                                                                                         .replace("Ufer", "")
                                                                                         for x in xs])
    assert applied == [[]] and "Ufer" not in outs[0]


# ---- the scheduler when everything is late ------------------------------------------------------------------------
def late_item(name: str, enqueued: float, deadline: float, importance: float = 0.5) -> WorkItem:
    return WorkItem(stream_id=name, model="asr", stage="asr", enqueued=enqueued, deadline=deadline,
                    importance=importance, payload=name)


def test_when_every_item_is_late_the_earliest_deadline_goes_first() -> None:
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    # enqueued in the reverse order of their deadlines, each with its own budget (its own lane); all long past
    for w in (late_item("c", 0.0, 3.0), late_item("b", 1.0, 2.0), late_item("a", 1.5, 1.6)):
        s.submit(w)
    order = [s.next_batch("asr", now=100.0)[0][0].payload for _ in range(3)]
    assert order == ["a", "b", "c"]


def test_late_items_in_one_batch_are_in_deadline_order_and_more_important_first() -> None:
    s = Scheduler(max_batch=4, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for w in (late_item("c", 0.0, 3.0), late_item("b", 1.0, 2.0), late_item("vip", 2.0, 9.0, importance=0.9),
              late_item("a", 1.5, 1.6)):
        s.submit(w)
    batch, shed = s.next_batch("asr", now=100.0)
    assert shed == [] and [w.payload for w in batch] == ["vip", "a", "b", "c"]


def test_late_committed_work_is_never_shed_and_late_tentative_work_is() -> None:
    s = Scheduler(max_batch=4, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    s.submit(late_item("committed", 0.0, 1.0))
    s.submit(WorkItem(stream_id="t", model="asr", stage="asr", enqueued=0.0, deadline=1.0, tentative=True,
                      payload="tentative"))
    batch, shed = s.next_batch("asr", now=100.0)
    assert [w.payload for w in batch] == ["committed"] and [w.payload for w in shed] == ["tentative"]


# ---- the stream log's link: backoff and one probe at a time ---------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("failure", [sqlite3.OperationalError("database is locked"),
                                     sqlite3.DatabaseError("database disk image is malformed"),
                                     json.JSONDecodeError("Expecting value", "{", 1)])
async def test_a_raw_sqlite_or_json_failure_of_a_store_read_is_an_outage_not_an_internal_error(
        failure: Exception) -> None:
    """A stream log read (a resume's snapshot, a replay) that SQLite refuses or whose row does not parse reached the
    stream untyped (error ``internal``, 1011) and was retried at once; it is the store's outage: StoreUnavailable
    (the client is told to retry) and the backoff."""
    clock = Clock()
    link = StoreLink(None, clock=clock)

    def read() -> None:
        raise failure

    try:
        with pytest.raises(StoreUnavailable):
            await link.call(read)
        assert link.failures == 1 and not link.ready()
    finally:
        link.close()


async def test_a_failing_store_is_left_alone_for_a_doubling_backoff_capped_at_5_s() -> None:
    clock = Clock()
    link = StoreLink(None, clock=clock)
    calls = []

    def down() -> None:
        calls.append(clock.t)
        raise OSError("connection refused")

    try:
        for backoff in (0.5, 1.0, 2.0, 4.0, 5.0, 5.0):
            with pytest.raises(StoreUnavailable, match="connection refused"):
                await link.call(down)
            assert link.down_until == pytest.approx(clock.t + backoff) and not link.ready() and not link.ok()
            with pytest.raises(StoreUnavailable, match="unavailable"):  # while down: not even tried
                await link.call(down)
            clock.t += backoff - 0.01
            assert not link.ready()
            clock.t += 0.01
            assert link.ready()
        assert len(calls) == 6 and link.failures == 6 and link.last_error == "connection refused"
        assert await link.call(lambda: "answer") == "answer"  # it answers again: healthy at once
        assert link.ok() and link.ready() and link.down_until == 0.0
        with pytest.raises(StoreUnavailable):
            await link.call(down)
        assert link.down_until == pytest.approx(clock.t + 0.5)  # the backoff starts over
    finally:
        link.close()


async def test_a_store_that_answers_no_is_not_a_store_that_is_down() -> None:
    link = StoreLink(None, clock=Clock())

    def missing() -> None:
        raise NotFound("no such stream")

    try:
        with pytest.raises(NotFound):
            await link.call(missing)
        assert link.ok() and link.ready()
    finally:
        link.close()


async def test_a_recovering_store_is_probed_by_one_call_at_a_time() -> None:
    clock = Clock()
    link = StoreLink(None, clock=clock)
    link.failures, link.down_until = 1, clock.t  # down before, backoff over: recovering
    inside = threading.Semaphore(0)
    release = threading.Event()
    most = [0, 0]  # now, most at once
    lock = threading.Lock()

    def probe() -> str:
        with lock:
            most[0] += 1
            most[1] = max(most)
        inside.release()
        release.wait(10)
        with lock:
            most[0] -= 1
        return "ok"

    try:
        calls = [asyncio.create_task(link.call(probe)) for _ in range(2)]
        assert await asyncio.to_thread(inside.acquire, True, 10)  # the first probe is in the store
        assert not await asyncio.to_thread(inside.acquire, True, 0.3)  # the second waits its turn (negative wait)
        release.set()
        assert await asyncio.gather(*calls) == ["ok", "ok"]
        assert most[1] == 1
    finally:
        release.set()
        link.close()


# ---- the unlogged-finals bound ------------------------------------------------------------------------------------
class DownStore:
    """A stream store that records new streams and then never writes a final (Redis down for good)."""

    def open_stream(self, *args: Any) -> None:
        return None

    def append_final(self, *args: Any) -> None:
        raise StoreUnavailable("the store is down")

    def close_stream(self, *args: Any) -> None:
        raise StoreUnavailable("the store is down")

    def close(self) -> None:
        return None


async def test_a_stream_whose_log_stays_down_is_closed_after_1000_unlogged_finals() -> None:
    assert journal.MAX_UNLOGGED == 1000  # docs/reliability.md: "bounded: 1,000 finals, then ... closed with 503"
    settings = Settings()
    settings.state.log_wait_s = 0.01
    s = session(store=DownStore(), settings=settings, max_events=10_000)
    assert s.journal is not None and s.journal.max_unlogged == journal.MAX_UNLOGGED
    await s.open()
    finals: list[dict[str, Any]] = []
    for i in range(journal.MAX_UNLOGGED + 1):
        await s.feed_text(f"line {i}", float(i))
        while not s.closed.is_set() and len(finals) <= i and i < journal.MAX_UNLOGGED:
            ev = (await asyncio.wait_for(s.events.get(), timeout=5)).to_wire()
            if ev["type"] == "final":
                finals.append(ev)
    await asyncio.wait_for(s.closed.wait(), timeout=10)
    assert len(finals) == journal.MAX_UNLOGGED and all(f["durable"] is False for f in finals)
    assert [f["seq"] for f in finals] == list(range(1, journal.MAX_UNLOGGED + 1))
    assert isinstance(s.error, LinguaFusionError) and s.error.status == 503
    assert "unavailable too long" in s.error.message
    rest = [s.events.get_nowait().to_wire() for _ in range(s.events.qsize())]
    assert not any(e["type"] == "final" for e in rest)  # the 1,001st was not sent
    await s.journal.log.close()


async def test_one_final_short_of_the_bound_the_stream_goes_on() -> None:
    settings = Settings()
    settings.state.log_wait_s = 0.01
    s = session(store=DownStore(), settings=settings)
    assert s.journal is not None
    s.journal.max_unlogged = 3
    await s.open()
    for i in range(3):
        await s.feed_text(f"line {i}", float(i))
    got: list[dict[str, Any]] = []
    while len([e for e in got if e["type"] == "final"]) < 3:
        got.append((await asyncio.wait_for(s.events.get(), timeout=5)).to_wire())
    assert not s.closed.is_set() and s.journal.pending == 3 and s.journal.full
    assert [e["type"] for e in got].count("not_durable") == 1  # said once, not per final
    await s.feed_text("line 3", 3.0)
    await asyncio.wait_for(s.closed.wait(), timeout=5)
    assert s.error is not None and s.error.status == 503
    await s.journal.log.close()


# ---- speech and confidence in a session ---------------------------------------------------------------------------
def utterance(seconds: float = 1.0) -> bytes:
    """PCM16: a loud second (speech, for the fake VAD), then a second of silence (end of utterance)."""
    loud = (0.5 * np.sin(np.arange(int(seconds * 16000)) * 0.3) * 32767).astype("<i2")
    return np.r_[loud, np.zeros(16000, dtype="<i2")].astype("<i2").tobytes()


async def one_final(port: FakePort, spec: StreamSpec) -> list[dict[str, Any]]:
    s = session(port, FakeOwner(), spec=spec)
    s.start()
    await s.feed_audio(utterance(), 0.0)
    await s.end()
    return await drain(s)


@pytest.mark.parametrize("confidence,gated", [(0.39, True), (0.4, False), (0.9, False)])
async def test_speech_under_the_confidence_floor_is_gated(confidence: float, gated: bool) -> None:
    port = FakePort(asr_text="hello there", asr_confidence=confidence)
    events = await one_final(port, StreamSpec(source_lang="en", targets=["es"], min_confidence=0.4))
    finals = [e for e in events if e["type"] == "final"]
    assert len(finals) == 1
    f = finals[0]
    if gated:
        assert f["gated"] == ["asr"] and f["text"] == "" and f["source_text"] == ""
        assert f["translations"] == {"es": ""} and f["confidence"] == confidence
        assert "0.39 below 0.4" in f["note"]
        assert port.count("mt") == 0  # what was not understood is not translated
    else:
        assert "gated" not in f and f["text"] == "HELLO THERE" and port.count("mt") == 1


async def test_a_stream_with_speech_speaks_each_caption_in_its_first_target() -> None:
    port = FakePort(asr_text="hello there")
    events = await one_final(port, StreamSpec(source_lang="en", targets=["es", "fr"], speech=True))
    kinds = [e["type"] for e in events]
    assert kinds.index("speech") > kinds.index("final")
    speech = next(e for e in events if e["type"] == "speech")
    assert speech["seq"] == 1 and speech["lang"] == "es" and speech["audio_base64"]
    tts = [(k, p) for k, p, _ in port.calls if k.task == "tts"]
    assert [(str(k), p) for k, p in tts] == [("tts:es", "HELLO THERE")]


async def test_without_speech_nothing_is_spoken_and_a_gated_caption_is_never_spoken() -> None:
    port = FakePort(asr_text="hello there")
    events = await one_final(port, StreamSpec(source_lang="en", targets=["es"]))
    assert not any(e["type"] == "speech" for e in events) and port.count("tts") == 0
    port = FakePort(asr_text="hello there", asr_confidence=0.1)
    events = await one_final(port, StreamSpec(source_lang="en", targets=["es"], speech=True))
    assert not any(e["type"] == "speech" for e in events) and port.count("tts") == 0


async def test_a_speech_failure_is_an_error_event_and_the_caption_stands() -> None:
    def tts_fails(key: Any, payload: Any) -> Any:
        if key.task == "tts":
            raise StoreUnavailable("tts down")  # any LinguaFusionError
        return None

    port = FakePort(asr_text="hello there", on_call=tts_fails)
    events = await one_final(port, StreamSpec(source_lang="en", targets=["es"], speech=True))
    errors = [e for e in events if e["type"] == "error"]
    assert [e["type"] for e in events if e["type"] in ("final", "error", "closed")] == ["final", "error", "closed"]
    assert "speech for caption 1 failed" in errors[0]["message"]


def test_fake_asr_output_is_typed() -> None:
    assert FakePort(asr_confidence=0.3).asr == AsrOutput("hello there", 0.3)
