"""Crash-safe streams: the write-ahead log (SQLite and a real Redis), and a server SIGKILLed mid-stream."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jiwer
import pytest
from conftest import BIN, REDIS, free_port, needs_redis, start_server, stop_server, talk_wav

from lingua_fusion.errors import AuthenticationError, NotFound, TakenOver
from lingua_fusion.state.redis_streams import RedisStreamStore
from lingua_fusion.state.streams import SQLiteStreamStore, StreamStore

SENTENCES = ["Good morning everyone and welcome to the quarterly review.", "The new office will open in the spring.",
             "Please send me the report before Friday.", "We need more time to finish the project.",
             "The train to the airport leaves every hour.", "Thank you all for your hard work."]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=needs_redis)])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made: list[StreamStore] = []

    def make() -> StreamStore:
        s: StreamStore = SQLiteStreamStore(tmp_path) if request.param == "sqlite" else RedisStreamStore(REDIS or "")
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_a_retried_write_never_logs_a_final_twice(store_factory: Any) -> None:
    sid = f"st_retry_{time.monotonic_ns()}"
    a = store_factory()
    a.open_stream(sid, "tok", {"spec": {}})
    for seq in (1, 2, 2, 1, 3):  # a write that timed out on our side but reached the store is written again
        a.append_final(sid, {"type": "final", "seq": seq, "end": float(seq), "text": f"t{seq}"}, float(seq))
    assert [e["seq"] for e in a.finals_after(sid, 0)] == [1, 2, 3]
    assert a.resume(sid, "tok")["last_seq"] == 3


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=needs_redis)])
def test_compaction_trims_long_logs_and_drops_expired_streams(kind: str, tmp_path: Path) -> None:
    store: Any = SQLiteStreamStore(tmp_path) if kind == "sqlite" else RedisStreamStore(REDIS or "", max_log=3)
    try:
        live, done = f"st_live_{time.monotonic_ns()}", f"st_done_{time.monotonic_ns()}"
        for sid in (live, done):
            store.open_stream(sid, "tok", {"spec": {}})
            for seq in range(1, 8):
                store.append_final(sid, {"type": "final", "seq": seq, "end": float(seq)}, float(seq))
        store.close_stream(done)
        if kind == "sqlite":
            store._db.execute("UPDATE stream_snapshot SET updated=0 WHERE stream_id=?", (done,))  # closed long ago
            assert store.compact(3600.0, 3) == {"streams_dropped": 1, "finals_trimmed": 4}
            with pytest.raises(NotFound):
                store.resume(done, "tok")
            assert (tmp_path / "streams.sqlite3-wal").stat().st_size == 0  # checkpointed
        # the live stream keeps its last 3 finals, its snapshot says where the log starts, numbering goes on
        assert [e["seq"] for e in store.finals_after(live, 0)] == [5, 6, 7]
        snap = store.resume(live, "tok")
        assert snap["log_from"] == 5 and snap["last_seq"] == 7
        store.append_final(live, {"type": "final", "seq": 8, "end": 8.0}, 8.0)
        assert store.resume(live, "tok")["last_seq"] == 8
    finally:
        store.close()


def test_a_resume_claims_the_stream_and_the_older_session_can_no_longer_write(store_factory: Any) -> None:
    sid = f"st_claim_{time.monotonic_ns()}"
    a, b = store_factory(), store_factory()  # two worker processes sharing the store
    a.open_stream(sid, "tok", {"spec": {}})
    a.append_final(sid, {"type": "final", "seq": 1, "end": 1.0, "text": "t1"}, 1.0, None, None, 0)
    with pytest.raises(AuthenticationError):
        b.claim(sid, "wrong")
    snap = b.claim(sid, "tok")  # a resume on the other process
    assert snap["epoch"] == 1 and snap["last_seq"] == 1
    with pytest.raises(TakenOver):  # the first session's next final is refused, not logged under seq 2
        a.append_final(sid, {"type": "final", "seq": 2, "end": 2.0, "text": "old"}, 2.0, None, None, 0)
    for _ in range(2):  # the resumed session's, retried, is logged once
        b.append_final(sid, {"type": "final", "seq": 2, "end": 2.0, "text": "new"}, 2.0, None, None, 1)
    with pytest.raises(TakenOver):  # nor may the first session close it
        a.close_stream(sid, 0)
    assert [e["text"] for e in a.finals_after(sid, 0)] == ["t1", "new"] and not a.resume(sid, "tok")["closed"]
    b.close_stream(sid, 1)
    assert a.resume(sid, "tok")["closed"] is True
    # what the take-over watch reads (api/takeover.py): every stream's epoch in one call; unknown ids left out
    assert a.epochs([sid, "st_never_opened"]) == {sid: 1} and a.epochs([]) == {}


def test_a_stream_log_from_before_the_epoch_column_is_migrated(tmp_path: Path) -> None:
    """A stream log written before the owner epoch had a column of its own (it was only in each snapshot's body)
    gets the column when opened: its streams read epoch 0 and a resume still claims them."""
    import sqlite3

    from lingua_fusion.state.private import private_dir, private_file
    from lingua_fusion.state.streams import token_digest

    old = sqlite3.connect(private_file(private_dir(tmp_path) / "streams.sqlite3"))
    old.execute("CREATE TABLE stream_snapshot (stream_id TEXT PRIMARY KEY, body TEXT, updated REAL)")
    body = {"spec": {}, "token_digest": token_digest("tok"), "last_seq": 0, "committed_until": 0.0, "closed": False,
            "epoch": 0}
    old.execute("INSERT INTO stream_snapshot VALUES ('st_old', ?, ?)", (json.dumps(body), time.time()))
    old.commit()
    old.close()
    store = SQLiteStreamStore(tmp_path)
    try:
        assert store.epochs(["st_old"]) == {"st_old": 0}
        assert store.claim("st_old", "tok")["epoch"] == 1 and store.epochs(["st_old"]) == {"st_old": 1}
    finally:
        store.close()


async def test_a_stream_resumed_on_another_server_ends_its_old_connection_within_seconds(tmp_path: Path) -> None:
    """Two servers on one state directory share the stream log, as the workers of ``serve --workers`` do. A stream
    opened on A and resumed on B: A's connection, which sends nothing more, ends ``taken_over`` (4409) within a
    few seconds (the take-over watch, api/takeover.py); before, it stayed open until its 60 s idle timeout, holding
    its quota. B's session goes on numbering after what A logged."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url_a, a = start_server(tmp_path, "--no-auth")
    url_b, b = start_server(tmp_path, "--no-auth")
    try:
        start = {"type": "start", "target_langs": ["es"], "inputs": ["text"], "partials": False}
        async with connect(url_a.replace("http", "ws") + "/v1/streams") as ws_a:
            await ws_a.send(json.dumps(start))
            ready = json.loads(await ws_a.recv())
            await ws_a.send(json.dumps({"type": "text", "text": "The dog is black.", "ts": 0.0}))
            while json.loads(await ws_a.recv())["type"] != "final":
                pass
            resume = {"type": "start", "resume": {"stream_id": ready["stream_id"],
                                                  "resume_token": ready["resume_token"], "last_seq": 1}}
            async with connect(url_b.replace("http", "ws") + "/v1/streams") as ws_b:
                await ws_b.send(json.dumps(resume))
                assert json.loads(await ws_b.recv())["resumed"] is True
                events = []
                with contextlib.suppress(ConnectionClosed):
                    async with asyncio.timeout(10):
                        async for m in ws_a:
                            events.append(json.loads(m))
                assert events and events[-1].get("code") == "taken_over" and ws_a.close_code == 4409
                await ws_b.send(json.dumps({"type": "text", "text": "The house is very big.", "ts": 2.0}))
                while (e := json.loads(await ws_b.recv()))["type"] != "final":
                    pass
                assert e["seq"] == 2
    finally:
        stop_server(a)
        stop_server(b)


def test_log_survives_a_new_process_and_checks_the_token(store_factory: Any) -> None:
    sid = f"st_test_{time.monotonic_ns()}"
    a = store_factory()
    a.open_stream(sid, "tok", {"spec": {"source_lang": "en"}})
    for seq in (1, 2, 3):
        a.append_final(sid, {"type": "final", "seq": seq, "end": seq * 2.0, "text": f"t{seq}"}, seq * 2.0, 100.0)
    b = store_factory()  # what a restarted server opens
    snap = b.resume(sid, "tok")
    assert snap["last_seq"] == 3 and snap["committed_until"] == 6.0 and snap["origin"] == 100.0
    assert snap["spec"] == {"source_lang": "en"} and not snap["closed"]
    assert [e["seq"] for e in b.finals_after(sid, 1)] == [2, 3]
    assert b.finals_after(sid, 3) == []
    with pytest.raises(AuthenticationError):
        b.resume(sid, "wrong")
    with pytest.raises(NotFound):
        b.resume("st_missing", "tok")
    b.close_stream(sid)
    assert a.resume(sid, "tok")["closed"] is True


def _run_killed_stream(tmp_path: Path, env: dict[str, str],
                       sig: signal.Signals = signal.SIGKILL) -> tuple[list[dict[str, Any]], str]:
    state = tmp_path / "state"
    state.mkdir()
    talk = tmp_path / "talk.wav"
    talk.write_bytes(talk_wav(SENTENCES))
    port = free_port()
    url, server = start_server(state, "--no-auth", env=env, port=port)
    cli = subprocess.Popen([str(BIN), "stream", str(talk), "--to", "es", "--realtime", "--json", "--url", url,
                            "--no-partials"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    first_final = threading.Event()

    def read() -> None:
        assert cli.stdout is not None
        for line in cli.stdout:
            lines.append(line)
            if '"type": "final"' in line:
                first_final.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_final.wait(60), "no caption before the kill"
        time.sleep(1.5)  # the fault's moment, mid-utterance (not a wait: nothing to wait for)
        server.send_signal(sig)
        server.wait(timeout=30)
        time.sleep(1.0)
        url2, server = start_server(state, "--no-auth", env=env, port=port)
        assert url2 == url
        cli.wait(timeout=180)
        reader.join(timeout=10)
    finally:
        if cli.poll() is None:
            cli.kill()
        stop_server(server)
    assert cli.returncode == 0, cli.stderr.read() if cli.stderr else ""
    err = cli.stderr.read() if cli.stderr else ""
    return [json.loads(x) for x in lines], err


def _check(events: list[dict[str, Any]], err: str) -> None:
    finals = [e for e in events if e["type"] == "final"]
    assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))  # unique and gap-free
    assert "reconnected" in err
    spoken = " ".join(f["source_text"] for f in finals)
    norm = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.Strip()])
    assert jiwer.wer(norm(" ".join(SENTENCES)), norm(spoken)) <= 0.2, spoken  # the whole recording is covered
    assert events[-1]["type"] == "closed"
    starts = [f["start"] for f in finals]
    assert starts == sorted(starts)


def test_sigkill_mid_stream_sqlite(tmp_path: Path) -> None:
    _check(*_run_killed_stream(tmp_path, {}))


@needs_redis
def test_sigkill_mid_stream_redis(tmp_path: Path) -> None:
    _check(*_run_killed_stream(tmp_path, {"LINGUAFUSION_STATE__REDIS_URL": REDIS or ""}))


def test_sigterm_drains_and_the_stream_moves_to_the_restarted_server(tmp_path: Path) -> None:
    events, err = _run_killed_stream(tmp_path, {}, signal.SIGTERM)
    _check(events, err)


async def test_text_sent_around_a_kill_is_translated_exactly_once(tmp_path: Path) -> None:
    """Timestamped text (and images) are kept by the SDK like audio: after a SIGKILL what the server had not
    logged is sent again, what it had logged is not (each sentence gives exactly one caption)."""
    import asyncio

    from lingua_fusion import MultimodalTranslator

    port = free_port()
    url, server = start_server(tmp_path, "--no-auth", port=port)
    sentences = [f"The house number {n} is very big." for n in range(1, 9)]
    finals: list[dict[str, Any]] = []
    try:
        s = MultimodalTranslator(base_url=url).stream(["es"], partials=False, slo="batch", inputs=["text"])
        breaks: list[int] = []  # reconnections done when each break was announced
        s.on_break = lambda st: breaks.append(st.reconnects)
        async with s:
            async def send() -> None:
                nonlocal server
                for k, text in enumerate(sentences):
                    if k == 4:  # the server dies between sentences, and again right after one is sent
                        server.send_signal(signal.SIGKILL)
                        await asyncio.to_thread(server.wait, 30)
                        _url, server = await asyncio.to_thread(start_server, tmp_path, "--no-auth", port=port)
                    await s.send_text(text, k * 0.5)
                    if k == 6:
                        server.send_signal(signal.SIGKILL)
                        await asyncio.to_thread(server.wait, 30)
                        _url, server = await asyncio.to_thread(start_server, tmp_path, "--no-auth", port=port)
                    await asyncio.sleep(0.5)
                await s.end()

            sender = asyncio.create_task(send())
            async for ev in s:
                if ev.type == "final":
                    finals.append(ev.model_dump())
            await sender
            assert s.reconnects >= 2
            assert breaks == list(range(s.reconnects))  # each break announced once, before its reconnection
            assert s.duplicates_dropped == 0  # the server re-sent no final this client had (exactly once)
    finally:
        stop_server(server)
    assert [f["seq"] for f in finals] == list(range(1, 9))
    assert [f["source_text"] for f in finals] == sentences


async def test_a_hostile_resume_is_refused_and_the_log_keeps_working(tmp_path: Path) -> None:
    import asyncio

    from websockets.asyncio.client import connect

    from lingua_fusion import MultimodalTranslator

    url, server = start_server(tmp_path, "--no-auth")
    ws_url = url.replace("http", "ws") + "/v1/streams"
    try:
        t = MultimodalTranslator(base_url=url)
        async with t.stream(["es"], partials=False, inputs=["text"]) as s:
            await s.send_text("The house is very big.", 0.0)
            await s.end()
            first = [ev async for ev in s if ev.type == "final"]
        ids = s.ready
        for last_seq in ("9223372036854775807", "Infinity", "-1", "1e400", "1.5", '"3"', "true", "null"):
            raw = ('{"type": "start", "resume": {"stream_id": "' + ids["stream_id"] + '", "resume_token": "'
                   + ids["resume_token"] + '", "last_seq": ' + str(last_seq) + "}}")
            async with connect(ws_url, open_timeout=10) as ws:
                await ws.send(raw)
                reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=10))
            assert reply["type"] == "error" and reply["code"] == "invalid_parameter", (last_seq, reply)
        # every other stream is still logged (the store was not left mid-transaction)
        async with t.stream(["es"], partials=False, inputs=["text"]) as s2:
            await s2.send_text("The dog is black.", 0.0)
            await s2.end()
            later = [ev.model_dump(exclude_none=True) async for ev in s2 if ev.type == "final"]
    finally:
        stop_server(server)
    assert len(first) == 1 and len(later) == 1 and "durable" not in later[0]
    store = SQLiteStreamStore(tmp_path)
    try:
        assert [e["seq"] for e in store.finals_after(s2.ready["stream_id"], 0)] == [1]
    finally:
        store.close()


def test_compaction_keeps_a_stream_another_process_resumes_meanwhile(tmp_path: Path) -> None:
    """serve --workers: one worker compacts while another resumes a stream silent past the retention. The resume
    (its claim refreshes the snapshot) commits while the compaction waits for the write lock: the stream and its
    log stay (before, the compaction had chosen the streams to drop before taking the lock, and dropped it)."""
    import sqlite3

    sid = f"st_compact_{time.monotonic_ns()}"
    compacting = SQLiteStreamStore(tmp_path)
    compacting.open_stream(sid, "tok", {"spec": {}})
    compacting.append_final(sid, {"type": "final", "seq": 1, "end": 1.0, "text": "kept"}, 1.0)
    compacting._db.execute("UPDATE stream_snapshot SET updated=? WHERE stream_id=?", (time.time() - 7200, sid))
    other = sqlite3.connect(next(tmp_path.rglob("streams.sqlite3")), isolation_level=None, timeout=10)
    try:
        other.execute("BEGIN IMMEDIATE")  # the other worker's claim, not committed yet
        other.execute("UPDATE stream_snapshot SET updated=? WHERE stream_id=?", (time.time(), sid))
        waiting = threading.Event()  # the compaction reached the statement that waits for the write lock
        compacting._db.set_trace_callback(lambda sql: waiting.set() if sql.startswith(("BEGIN IMMEDIATE", "DELETE"))
                                          else None)
        done: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: done.update(compacting.compact(3600, 100)))
        worker.start()
        assert waiting.wait(10)
        other.execute("COMMIT")
        worker.join(20)
        compacting._db.set_trace_callback(None)
        assert done == {"streams_dropped": 0, "finals_trimmed": 0}
        assert [e["text"] for e in compacting.finals_after(sid, 0)] == ["kept"]
        assert compacting.resume(sid, "tok")["last_seq"] == 1
    finally:
        other.close()
        compacting.close()
