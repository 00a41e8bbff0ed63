"""Sessions that run for hours (issue 32): nothing a stream keeps grows with its length.

The long test streams 10 minutes of speech with pauses (and a 2-minute break) through a real server in this event
loop, over a real WebSocket, as fast as the stream's audio budget lets it (4x real time: about 3 minutes), and
watches the live session's structures as it goes: the audio buffer holds the open utterance (not the break), the
VAD's window history is one utterance's, the stream log is compacted to its last finals, and a stream silent for
longer than the log's retention is kept because its session is live. Then a resume from before the compacted log
is told what it cannot have and gets the rest, exactly once, and the stream goes on gap-free. The issue asks for
10 real-time minutes; at 1x that one test would take 10 minutes of `make test`, so it runs the same 10 minutes of
stream at the ingest's fastest pace. It asserts sizes, never speed (the RSS and latency figures over two hours are
``bench/long_session.py``'s, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REDIS, needs_redis, serve_in_loop

from lingua_fusion.config import Settings
from lingua_fusion.errors import NotFound
from lingua_fusion.lab.long_talk import FeedStats, Piece, SpeechClock, feed, plan_talk, sentence_pcm
from lingua_fusion.state.redis_streams import RedisStreamStore
from lingua_fusion.state.streams import SQLiteStreamStore
from lingua_fusion.stream.ingest import VAD_PIECE_WINDOWS, AudioTimeline
from lingua_fusion.stream.policy import WINDOW
from lingua_fusion.stream.protocol import POLICIES
from lingua_fusion.stream.service import StreamService
from lingua_fusion.types import SR

WAIT_S = 60.0  # a wait for something that must happen, never a speed bound

SENTENCES = ["Good morning everyone and welcome to the quarterly review.", "The new office will open in the spring.",
             "Please send me the report before Friday.", "We need more time to finish the project.",
             "The train to the airport leaves every hour.", "Thank you all for your hard work."]


# ---- the pure parts -----------------------------------------------------------------------------------------------
def test_a_pause_is_released_from_the_timeline_but_the_reorder_window_still_places_late_audio() -> None:
    tl = AudioTimeline(reorder_window_s=2.0)
    tl.write(np.zeros(10 * SR, dtype=np.float32), 0.0)
    tl.release(9.7)  # the open utterance starts at 9.7 s: before it, only the reorder window is kept
    assert (tl.start, len(tl.buf)) == (8 * SR, 2 * SR)
    tl.release(5.0)  # never backwards
    assert tl.start == 8 * SR
    assert tl.write(np.ones(SR // 2, dtype=np.float32), 8.5)  # late, inside the window: placed, as before
    assert tl.stats.reordered == 1 and tl.view(8.5, 9.0).min() == 1.0
    assert not tl.write(np.ones(SR // 2, dtype=np.float32), 7.0)  # older than the window: dropped, as before
    assert tl.stats.late_dropped == 1


def test_a_talk_is_contiguous_and_its_pending_speech_is_what_was_sent_and_not_captioned() -> None:
    plan = plan_talk([SR, 2 * SR], 60.0, seed=3, break_every_s=20.0, break_s=5.0)
    assert plan[0].start == 0 and all(a.end == b.start for a, b in zip(plan, plan[1:], strict=False))
    assert plan[-1].end >= 60 * SR and any(p.n == 5 * SR and p.sentence == -1 for p in plan)
    clock = SpeechClock([Piece(0, SR, 0), Piece(SR, SR, -1), Piece(2 * SR, 2 * SR, 1)])
    assert [clock.before(t) for t in (0.0, 0.5, 1.5, 3.0, 9.0)] == [0.0, 0.5, 1.0, 2.0, 3.0]
    assert clock.pending(3.0, 0.5) == 1.5 and clock.pending(1.0, 2.0) == 0.0


async def test_feed_paces_under_the_budget_and_holds_back_until_speech_is_captioned() -> None:
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    plan = [Piece(0, 20 * SR, 0)]
    speech = SpeechClock(plan)
    sent: list[tuple[int, float]] = []

    def captioned() -> float:
        return max(0.0, 2.0 * (now[0] - 1.0))  # a server that captions at 2x real time, slower than the budget

    async def send(pcm: bytes, ts: float) -> None:
        assert speech.pending(ts + 0.5, captioned()) <= 4.0  # never more than max_pending_s uncaptioned
        sent.append((len(pcm), ts))

    stats = await feed(plan, [bytes(40 * SR)], send, captioned, speed=4.0, burst_s=2.0, chunk_s=0.5,
                       max_pending_s=4.0, clock=lambda: now[0], sleep=sleep)
    assert [ts for _n, ts in sent] == [k * 0.5 for k in range(40)] and {n for n, _ts in sent} == {SR}
    assert stats.sent_s == 20.0 and stats.waits > 0 and stats.waited_s > 0
    stuck = await feed(plan, [bytes(40 * SR)], send_nowhere, lambda: 0.0, speed=1e9, burst_s=2.0, max_pending_s=4.0,
                       max_hold_s=1.0, clock=lambda: now[0], sleep=sleep)
    assert stuck.sent_s == 20.0  # no caption ever: held 1 s a chunk, then sent anyway (never stuck)
    resumed: list[float] = []

    async def again(pcm: bytes, ts: float) -> None:
        resumed.append(ts)

    await feed(plan, [bytes(40 * SR)], again, lambda: 20.0, speed=4.0, burst_s=2.0, from_s=12.25,
               clock=lambda: now[0], sleep=sleep)
    assert resumed[0] == 12.25 and resumed[-1] == 19.75  # a resume re-sends from where it is told, to the sample


async def send_nowhere(pcm: bytes, ts: float) -> None:
    return None


async def test_the_talk_is_paced_at_most_at_the_budget() -> None:
    now = [0.0]
    seconds = []

    async def sleep(s: float) -> None:
        now[0] += s

    async def send(pcm: bytes, ts: float) -> None:
        seconds.append(len(pcm) / 2 / SR)

    await feed([Piece(0, 60 * SR, -1)], [], send, lambda: 60.0, speed=4.0, burst_s=2.0, clock=lambda: now[0],
               sleep=sleep)
    assert sum(seconds) == 60.0 and now[0] >= (60.0 - 0.9 * 2.0) / (0.9 * 4.0) - 1e-6  # 0.9 x the budget at most


# ---- the stream log keeps live streams ---------------------------------------------------------------------------
def test_compaction_keeps_a_live_stream_silent_past_the_retention_and_drops_a_left_one(tmp_path: Path) -> None:
    store = SQLiteStreamStore(tmp_path)
    try:
        for sid in ("st_live", "st_left"):
            store.open_stream(sid, "tok", {"spec": {}})
            store.append_final(sid, {"type": "final", "seq": 1, "end": 1.0}, 1.0)
        # an hour's break: no final for longer than the retention (before, a live stream was dropped for it)
        store._db.execute("UPDATE stream_snapshot SET updated=?", (time.time() - 7200,))
        assert store.compact(3600.0, 100, ["st_live"]) == {"streams_dropped": 1, "finals_trimmed": 0}
        with pytest.raises(NotFound):
            store.resume("st_left", "tok")
        store.append_final("st_live", {"type": "final", "seq": 2, "end": 2.0}, 2.0)  # the talk goes on
        assert [e["seq"] for e in store.finals_after("st_live", 0)] == [1, 2]
        # its clock was refreshed: another process's compaction, which does not serve it, keeps it too
        assert store.compact(3600.0, 100) == {"streams_dropped": 0, "finals_trimmed": 0}
    finally:
        store.close()


@needs_redis
def test_redis_compaction_gives_a_live_streams_keys_their_ttl_again() -> None:
    import redis

    from lingua_fusion.state import redis_keys

    store = RedisStreamStore(REDIS or "", ttl_s=600)
    r = redis.Redis.from_url(REDIS or "")
    sid = f"st_long_{time.monotonic_ns()}"
    try:
        store.open_stream(sid, "tok", {"spec": {}})
        store.append_final(sid, {"type": "final", "seq": 1, "end": 1.0}, 1.0)
        for key in (redis_keys.stream_snapshot(sid), redis_keys.stream_log(sid)):
            r.expire(key, 5)  # a session silent for almost the TTL
        store.compact(3600.0, 100, [sid, "st_never_opened"])
        assert all(r.ttl(k) > 500 for k in (redis_keys.stream_snapshot(sid), redis_keys.stream_log(sid)))
        assert r.exists(redis_keys.stream_snapshot("st_never_opened")) == 0  # nothing made for a stream not there
    finally:
        r.delete(redis_keys.stream_snapshot(sid), redis_keys.stream_log(sid))
        r.close()
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=needs_redis)])
def test_a_replay_reads_the_finals_after_what_the_client_has_from_a_long_log(kind: str, tmp_path: Path) -> None:
    """Redis reads a replay from the log's end back, a page (REPLAY_PAGE) at a time: every page edge is right."""
    store: Any = SQLiteStreamStore(tmp_path) if kind == "sqlite" else RedisStreamStore(REDIS or "")
    sid = f"st_replay_{time.monotonic_ns()}"
    try:
        store.open_stream(sid, "tok", {"spec": {}})
        for seq in range(1, 601):
            store.append_final(sid, {"type": "final", "seq": seq, "end": float(seq)}, float(seq))
        for after in (0, 1, 88, 343, 344, 345, 599, 600):  # 600 - 256 = 344: the first page's edge
            assert [e["seq"] for e in store.finals_after(sid, after)] == list(range(after + 1, 601)), after
    finally:
        store.close()


# ---- ten minutes of stream ---------------------------------------------------------------------------------------
def serve(settings: Settings) -> contextlib.AbstractAsyncContextManager[tuple[str, Any]]:
    """A real server in this event loop: (host:port, app) (conftest.serve_in_loop)."""
    return serve_in_loop(settings, WAIT_S)


@dataclass
class Connection:
    """One WebSocket of the stream: every event it got, in order."""

    ws: Any
    got: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, host: str, start: dict[str, Any]) -> tuple[Connection, dict[str, Any]]:
        from websockets.asyncio.client import connect

        ws = await connect(f"ws://{host}/v1/streams", open_timeout=WAIT_S, max_size=16 * 2**20)
        await ws.send(json.dumps(start))
        ready = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert ready["type"] == "ready", ready
        c = cls(ws)
        c.reader = asyncio.create_task(c._read())
        return c, ready

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                self.got.append(json.loads(raw))

    async def send_audio(self, pcm: bytes, ts: float) -> None:
        await self.ws.send(json.dumps({"type": "audio", "data": base64.b64encode(pcm).decode(), "ts": ts}))

    def finals(self) -> list[dict[str, Any]]:
        return [e for e in self.got if e["type"] == "final"]

    def captioned(self) -> float:
        """The end of the latest final received (stream s)."""
        fs = self.finals()
        return float(fs[-1]["end"]) if fs else 0.0

    async def hang_up(self) -> None:
        await self.ws.close()
        assert self.reader is not None
        await self.reader


@dataclass
class Peaks:
    """The largest size each structure of the live session reached."""

    buffer_s: float = 0.0
    vad_windows: int = 0
    gaps: int = 0
    pending_commits: int = 0
    queued_events: int = 0
    unlogged: int = 0
    tasks: int = 0
    log_rows: int = 0
    samples: int = 0

    def watch(self, service: StreamService, stream_id: str, db: Path) -> None:
        s = service.sessions.get(stream_id)
        if s is not None:
            self.buffer_s = max(self.buffer_s, len(s.timeline.buf) / SR)
            self.vad_windows = max(self.vad_windows, len(s.policy.probs))
            self.gaps = max(self.gaps, len(s.timeline.gaps))
            self.pending_commits = max(self.pending_commits, s.finals.pending.qsize())
            self.queued_events = max(self.queued_events, s.outbox.events.qsize())
            self.unlogged = max(self.unlogged, s.journal.pending if s.journal is not None else 0)
            self.tasks = max(self.tasks, len(s._tasks))
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as c:
            rows = c.execute("SELECT COUNT(*) FROM stream_log WHERE stream_id=?", (stream_id,)).fetchone()[0]
        self.log_rows = max(self.log_rows, int(rows))
        self.samples += 1


async def watching(peaks: Peaks, service: StreamService, stream_id: str, db: Path) -> None:
    while True:
        peaks.watch(service, stream_id, db)
        await asyncio.sleep(0.25)


MAX_LOG = 20  # the stream log keeps a live stream's last 20 finals (compacted every 2 s)
RETENTION_S = 8.0  # a stream no session serves is dropped 8 s after its last write
BREAK_S = 120.0  # a 2-minute break in the talk: at 4x at least 25 s of wall time, three times the retention


@pytest.mark.slow
# 10 minutes of stream audio at the ingest's 4x (the talk sends at 0.9 of it) take 167 s by themselves, and the
# models load first: past the suite's 300 s on the loaded 2 cores, so 600
@pytest.mark.timeout(600)
async def test_ten_minutes_of_talk_keep_every_structure_bounded_and_a_resume_after_compaction_works(
        tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    settings.server.auth = False
    settings.state.max_log_finals, settings.state.compact_interval_s = MAX_LOG, 2.0
    settings.state.retention_s = RETENTION_S
    pcms = await asyncio.to_thread(sentence_pcm, SENTENCES)
    plan = plan_talk([len(p) // 2 for p in pcms], 600.0, seed=1, break_every_s=240.0, break_s=BREAK_S)
    hang_up_s = 420.0  # after the first break and many compactions
    first = [p for p in plan if p.start < hang_up_s * SR]
    start = {"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": True, "slo": "standard"}
    peaks = Peaks()
    async with serve(settings) as (host, app):
        service: StreamService = app.state.streams
        db = next(tmp_path.rglob("streams.sqlite3"))
        one, ready = await Connection.open(host, start)
        sid = ready["stream_id"]
        watcher = asyncio.create_task(watching(peaks, service, sid, db))
        budget = {"speed": float(ready["max_audio_speed"]), "burst_s": float(ready["max_audio_burst_s"])}
        stats = FeedStats()
        await feed(first, pcms, one.send_audio, one.captioned, stats=stats, **budget)
        await one.hang_up()  # the connection drops, with captions still on their way
        # a client that lost everything resumes from the start: the log's last finals, and a notice for the rest
        two, again = await Connection.open(host, {"type": "start", "resume": {
            "stream_id": sid, "resume_token": ready["resume_token"], "last_seq": 0}})
        assert again["resumed"] is True and again["last_seq"] >= len(one.finals()), again
        last_logged = int(again["last_seq"])
        async with asyncio.timeout(WAIT_S):
            while len(two.finals()) < 1:  # noqa: ASYNC110 (the replay comes right after ready)
                await asyncio.sleep(0.05)
        await feed(plan, pcms, two.send_audio, two.captioned, from_s=float(again["resume_from_ts"]), stats=stats,
                   **budget)
        await two.ws.send(json.dumps({"type": "end"}))
        async with asyncio.timeout(WAIT_S * 3):
            await two.reader
        watcher.cancel()
        peaks.watch(service, sid, db)

    # the resume: log_compacted names what compaction took, then each final left, once, in order, as first sent
    notices = errors(two)
    assert [n["code"] for n in notices] == ["log_compacted"], notices
    log_from = int(notices[0]["message"].split("..")[1].split()[0]) + 1
    assert notices[0]["message"].startswith("finals 1..")
    replayed = [e for e in two.finals() if e["seq"] <= last_logged]
    assert [e["seq"] for e in replayed] == list(range(log_from, last_logged + 1))
    assert len(replayed) <= MAX_LOG * 3  # the compacted log, plus what a few compaction intervals logged
    sent_first = {e["seq"]: e for e in one.finals()}
    for e in replayed:
        if e["seq"] in sent_first:
            assert (e["source_text"], e["text"], e["end"]) == (sent_first[e["seq"]]["source_text"],
                                                                 sent_first[e["seq"]]["text"],
                                                                 sent_first[e["seq"]]["end"])
    # the stream went on after it, numbered on from the log: every caption exactly once over both connections
    seqs = sorted({e["seq"] for e in one.finals()} | {e["seq"] for e in two.finals()})
    assert seqs == list(range(1, len(seqs) + 1)) and two.got[-1]["type"] == "closed"
    assert [e["seq"] for e in two.finals() if e["seq"] > last_logged] == list(range(last_logged + 1, seqs[-1] + 1))
    assert errors(one) == [], "the live stream lost its log in the break"
    spoken = sum(1 for p in plan if p.sentence >= 0)
    heard = {e["seq"] for e in one.finals() + two.finals() if e["source_text"].strip()}
    assert len(heard) >= spoken // 2, (len(heard), spoken)  # the talk was captioned (not only kept)

    # what the session kept, at its largest: one utterance's audio and VAD windows, never the break's
    policy = POLICIES[start["slo"]]
    assert peaks.samples > 100
    assert peaks.buffer_s <= policy.max_utterance_s + 2.0 + 1.0, peaks  # + the reorder window + a chunk
    assert peaks.vad_windows <= (policy.max_utterance_s + 1.0) * SR / WINDOW + VAD_PIECE_WINDOWS, peaks
    assert peaks.gaps == 0 and peaks.log_rows <= MAX_LOG * 3, peaks
    assert seqs[-1] > MAX_LOG * 3  # ... while the stream logged far more finals than that


def errors(c: Connection) -> list[dict[str, Any]]:
    """The error events a connection got, but ``audio_paced`` (the budget slowing the reader: nothing lost)."""
    return [e for e in c.got if e["type"] == "error" and e.get("code") != "audio_paced"]
