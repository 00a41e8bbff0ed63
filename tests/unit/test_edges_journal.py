"""Edges of the stream journal: cursors, one not_durable and one durable per outage, retry pacing, closed streams,
finish, settled, adopt, close (stream/journal.py).

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed.
"""

from __future__ import annotations

from typing import Any

import pytest


class MemStore:
    """An in-memory stream store: what the journal asked of it, and switches for down, slow and lost."""

    def __init__(self) -> None:
        import threading

        self.calls: list[tuple[Any, ...]] = []
        self.down = False
        self.lost = False
        self.gate = threading.Event()  # cleared: append_final blocks until set (a slow store)
        self.gate.set()
        self.closed = False

    def open_stream(self, sid: str, token: str, snap: dict[str, Any]) -> None:
        self.calls.append(("open", sid, token, snap))

    def append_final(self, sid: str, final: dict[str, Any], committed: Any, origin: Any, text_until: Any,
                     epoch: Any = None) -> None:
        from lingua_fusion.errors import NotFound, StoreUnavailable

        self.gate.wait(30)
        if self.lost:
            raise NotFound("no such stream")
        if self.down:
            raise StoreUnavailable("redis down")
        self.calls.append(("append", final["seq"], committed, origin, text_until))

    def close_stream(self, sid: str, epoch: Any = None) -> None:
        from lingua_fusion.errors import StoreUnavailable

        if self.down:
            raise StoreUnavailable("redis down")
        self.calls.append(("close", sid))

    def close(self) -> None:
        self.closed = True


class Gauge:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


class FakeMetrics:
    def __init__(self) -> None:
        self.unlogged_finals, self.store_failures = Gauge(), Gauge()


def final(seq: int, modality: str = "audio", end: float = 1.0) -> Any:
    from lingua_fusion.stream.events import Final

    return Final(start=0.0, end=end, source_text="x", text="x", translations={"es": "x"}, confidence=1.0, seq=seq,
                 modality=modality)


def journal_on(store: MemStore, wait_s: float = 5.0, metrics: Any = None) -> tuple[Any, list[Any]]:
    from lingua_fusion.stream.journal import Journal, StreamLog

    events: list[Any] = []
    return Journal(StreamLog(store, metrics), "st_1", events.append, wait_s=wait_s), events


async def test_the_journal_records_the_stream_and_each_finals_cursor() -> None:
    store, metrics = MemStore(), FakeMetrics()
    j, events = journal_on(store, metrics=metrics)
    await j.open("tok", {"source_lang": "en"})
    audio, text = final(1, "audio", 2.5), final(2, "text", 3.0)
    await j.append(audio, 10.0)
    await j.append(text, 10.0)
    assert store.calls == [("open", "st_1", "tok", {"spec": {"source_lang": "en"}}),
                           ("append", 1, 2.5, 10.0, None), ("append", 2, None, 10.0, 3.0)]
    assert audio.durable is None and text.durable is None and events == [] and j.logged_seq == 2
    assert metrics.unlogged_finals.value == 0 and j.pending == 0
    assert j._writer is None  # a healthy log is written from append itself (one hop to a store thread), no task
    assert await j.finish(5.0) == 0 and store.calls[-1] == ("close", "st_1")
    await j.log.close()
    assert store.closed


async def test_an_outage_is_announced_once_and_its_end_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from lingua_fusion.stream.events import Durable, NotDurable

    store, metrics = MemStore(), FakeMetrics()
    j, events = journal_on(store, wait_s=0.05, metrics=metrics)
    store.down = True
    first, second = final(1), final(2)
    await j.append(first, 0.0)  # the log was healthy: the final waited for it, then went out not durable
    assert first.durable is False and metrics.store_failures.value == 1
    assert [type(e) for e in events] == [NotDurable] and events[0].from_seq == 1
    assert events[0].message == ("captions from 1 on are sent before they are crash-safe (the stream log is down); "
                                 "a durable event follows when they are")
    task = asyncio.create_task(j.append(second, 0.0))  # known down: no wait at all
    for _ in range(20):
        await asyncio.sleep(0)
        if task.done():
            break
    assert task.done() and second.durable is False and len(events) == 1 and metrics.unlogged_finals.value == 2
    store.down = False
    j.log.link.down_until = 0.0  # the backoff is over
    async with j._progress:
        await asyncio.wait_for(j._progress.wait_for(lambda: j.logged_seq == 2), 10)
    await asyncio.wait_for(j._writer, 10)  # type: ignore[arg-type]
    assert [type(e) for e in events] == [NotDurable, Durable] and events[1].through_seq == 2
    assert metrics.unlogged_finals.value == 0
    store.down = True  # a second outage is announced again
    third = final(3)
    j.log.link.down_until = 0.0
    await j.append(third, 0.0)
    assert [type(e) for e in events] == [NotDurable, Durable, NotDurable] and events[2].from_seq == 3
    j.detach()
    await j.log.close()


async def test_a_slow_write_is_called_slow() -> None:
    store = MemStore()
    store.gate.clear()
    j, events = journal_on(store, wait_s=0.05)
    f = final(1)
    await j.append(f, 0.0)
    assert f.durable is False and "(the stream log is slow)" in events[0].message
    store.gate.set()
    await j.log.close()


async def test_healthy_writes_announce_nothing() -> None:
    store = MemStore()
    j, events = journal_on(store)
    for seq in (1, 2, 3):
        f = final(seq)
        await j.append(f, 0.0)
        assert f.durable is None
    assert events == []
    await j.log.close()


async def test_the_writer_paces_its_retries_by_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    real_sleep = asyncio.sleep
    store = MemStore()
    j, _events = journal_on(store, wait_s=0.0)
    t = [100.0]
    j.log.link.clock = lambda: t[0]
    asked: list[float] = []
    failures = [3]

    def flaky(*args: Any) -> None:
        from lingua_fusion.errors import StoreUnavailable

        if failures[0]:
            failures[0] -= 1
            raise StoreUnavailable("redis down")
        return MemStore.append_final(store, *args)

    monkeypatch.setattr(store, "append_final", flaky)

    async def fake_sleep(d: float, *a: Any) -> None:
        asked.append(d)
        t[0] += d
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    await j.append(final(1), 0.0)
    async with asyncio.timeout(10):
        while j.logged_seq < 1:
            await real_sleep(0.01)
    # after each failure 0.05 s, then the rest of the backoff (0.5, 1, 2 s), at most 1 s at a time
    assert asked == pytest.approx([0.05, 0.45, 0.05, 0.95, 0.05, 1.0, 0.95])
    await j.log.close()


async def test_a_lost_stream_is_reported_once_and_not_retried() -> None:
    store = MemStore()
    store.lost = True
    j, events = journal_on(store, wait_s=0.05)
    await j.append(final(1), 0.0)
    await j._writer  # type: ignore[misc]
    errors = [e for e in events if e.TYPE == "error"]
    assert [e.code for e in errors] == ["not_found"] and errors[0].message == \
        "the stream log lost this stream: no such stream"
    assert j.pending == 0
    await j.log.close()


async def test_after_the_stream_closed_no_durable_event_and_the_log_owns_the_writer() -> None:
    import asyncio

    store = MemStore()
    j, events = journal_on(store, wait_s=0.05)
    j.detach()  # nothing pending, no writer: nothing to do
    store.down = True
    await j.append(final(1), 0.0)
    n = len(events)
    j.detach()
    assert j.log._orphans.get("st_1") is j._writer
    store.down = False
    j.log.link.down_until = 0.0
    await asyncio.wait_for(j.log.settled("st_1", wait_s=10), 11)
    assert ("append", 1, 1.0, 0.0, None) in store.calls and len(events) == n  # written; no durable event
    assert "st_1" not in j.log._orphans  # the finished writer is let go
    assert await j.finish(1.0) == 0
    await j.log.close()


async def test_the_journal_gives_up_a_closed_streams_backlog_only_after_its_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import types

    from lingua_fusion.stream import journal as journal_mod

    now = [1000.0]
    monkeypatch.setattr(journal_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store = MemStore()
    j, _events = journal_on(store, wait_s=0.05)
    store.down = True
    await j.append(final(1), 0.0)
    j.detach()  # closed at 1000.0
    now[0] = 1000.0 + journal_mod.BACKLOG_AFTER_CLOSE_S  # exactly its time: still trying
    store.down = False
    j.log.link.down_until = 0.0
    await asyncio.wait_for(j.log.settled("st_1", wait_s=10), 11)
    assert j.pending == 0
    store.down = True
    await j.append(final(2), 0.0)
    now[0] += journal_mod.BACKLOG_AFTER_CLOSE_S + 0.001  # past it: given up
    j.log.link.down_until = 0.0
    await asyncio.wait_for(j._writer, 10)  # type: ignore[arg-type]
    assert j.pending == 1
    await j.log.close()


async def test_finish_waits_for_the_backlog_and_closes_the_stream_only_when_it_is_empty() -> None:
    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    store.down = True
    await j.append(final(1), 0.0)
    assert await j.finish(0.05) == 1 and ("close", "st_1") not in store.calls
    store.down = False
    j.log.link.down_until = 0.0
    assert await j.finish(10.0) == 0 and store.calls[-1] == ("close", "st_1")
    await j.log.close()


async def test_settled_waits_a_bounded_time_and_survives_a_cancelled_writer() -> None:
    import asyncio

    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    await j.log.settled("nobody")  # no writer: nothing to wait for
    store.gate.clear()  # the write hangs
    await j.append(final(1), 0.0)
    j.detach()
    await asyncio.wait_for(j.log.settled("st_1", wait_s=0.05), 5)  # gave up waiting, did not raise
    waiting = asyncio.create_task(j.log.settled("st_1", wait_s=30))
    await asyncio.sleep(0)
    j.log._orphans["st_1"].cancel()
    await asyncio.wait_for(waiting, 5)  # the writer was cancelled: settled returns
    store.gate.set()
    await j.log.close()


async def test_a_newer_writer_is_not_let_go_when_an_older_one_ends() -> None:
    import asyncio

    from lingua_fusion.stream.journal import StreamLog

    log = StreamLog(MemStore())
    old_done, new_done = asyncio.Event(), asyncio.Event()
    old = asyncio.create_task(old_done.wait())
    new = asyncio.create_task(new_done.wait())
    log.adopt("st_1", old)
    log.adopt("st_1", new)
    old_done.set()
    await old
    await asyncio.sleep(0)
    assert log._orphans.get("st_1") is new
    new_done.set()
    await new
    await asyncio.sleep(0)
    assert "st_1" not in log._orphans
    await log.close()


async def test_closing_the_log_cancels_its_writers_and_closes_the_store() -> None:
    import asyncio

    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    store.down = True
    await j.append(final(1), 0.0)
    j.detach()
    writer = j.log._orphans["st_1"]
    await j.log.close()
    assert writer.cancelled() and j.log._orphans == {} and store.closed
    await asyncio.sleep(0)


async def test_a_log_call_gives_up_after_its_wait() -> None:
    from lingua_fusion.errors import StoreUnavailable

    store = MemStore()
    store.gate.clear()
    j, _events = journal_on(store)
    with pytest.raises(StoreUnavailable, match="did not answer"):
        await j.log.call(store.append_final, "st_1", {"seq": 1}, None, None, None, wait_s=0.05)
    store.gate.set()
    await j.log.close()


async def test_a_healthy_write_returns_when_it_is_logged_not_after_the_whole_wait() -> None:
    import asyncio

    store = MemStore()
    j, events = journal_on(store, wait_s=120.0)  # a hang detector: the write itself takes milliseconds
    f = final(1)
    await asyncio.wait_for(j.append(f, 0.0), 30)
    assert f.durable is None and events == []
    await j.log.close()


async def test_a_write_that_lands_as_the_wait_runs_out_is_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    real_wait_for = asyncio.wait_for

    async def late(aw: Any, _limit: float | None) -> Any:  # the write lands, and the timeout fires anyway
        await real_wait_for(aw, 30)
        raise TimeoutError

    store = MemStore()
    j, events = journal_on(store, wait_s=1.0)
    monkeypatch.setattr(asyncio, "wait_for", late)
    f = final(1)
    await j.append(f, 0.0)
    monkeypatch.undo()
    assert f.durable is None and events == []
    await j.log.close()


async def test_finish_without_finals_and_with_the_log_gone_at_the_end() -> None:
    store = MemStore()
    j, _events = journal_on(store)
    assert await j.finish(1.0) == 0 and store.calls == [("close", "st_1")]  # no writer ever started
    await j.append(final(1), 0.0)
    store.down = True  # everything is logged, but recording the close fails: not an error for the stream
    assert await j.finish(1.0) == 0
    await j.log.close()


async def test_closing_the_log_survives_a_writer_that_failed() -> None:
    import asyncio

    from lingua_fusion.stream.journal import StreamLog

    log = StreamLog(MemStore())

    async def broken() -> None:
        raise RuntimeError("a bug in a writer")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    log._orphans["st_x"] = task  # finished with an error, still listed
    await log.close()
    assert log._orphans == {}


async def test_settled_gives_up_after_its_wait() -> None:
    import asyncio

    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    store.gate.clear()  # the write hangs (30 s)
    await j.append(final(1), 0.0)
    j.detach()
    loop = asyncio.get_running_loop()
    t = loop.time()
    await j.log.settled("st_1", wait_s=0.05)
    assert loop.time() - t < 10  # a hang detector: 0.05 s asked, the write hangs for 30 s
    store.gate.set()
    await j.log.close()


@pytest.mark.parametrize("refusal", ["taken_over", "lost"])
async def test_a_refused_backlog_leaves_the_unlogged_gauge(refusal: str) -> None:
    """The store refuses the backlog for good (the stream was resumed elsewhere, or is gone from the store): the
    finals are dropped, and /metrics' unlogged-finals gauge goes back down (before, it kept them counted for the
    life of the process)."""
    from lingua_fusion.errors import TakenOver

    store = MemStore()
    store.down = True  # two finals go out before they are logged
    metrics = FakeMetrics()
    j, _events = journal_on(store, wait_s=0.05, metrics=metrics)
    await j.append(final(1), 0.0)
    await j.append(final(2), 0.0)
    assert metrics.unlogged_finals.value == 2
    failed: list[Any] = []
    j._fail = failed.append
    if refusal == "lost":
        store.lost = True
    else:
        def taken(*_args: Any) -> None:
            raise TakenOver("resumed elsewhere")

        store.append_final = taken  # type: ignore[method-assign]
    store.down = False
    await j._writer  # type: ignore[misc]
    assert j.pending == 0 and metrics.unlogged_finals.value == 0
    assert [type(e) for e in failed] == ([TakenOver] if refusal == "taken_over" else [])
    await j.log.close()
