"""The promises of README.md, docs/api.md and docs/reliability.md (listed in docs/testing.md), checked where the
user sees them: on the wire, with a raw WebSocket client that counts every message the server sent (the SDK drops
finals it has seen, so an SDK-level test cannot see a final sent twice), and over HTTP.

Servers are real (``create_app`` under uvicorn in the test's event loop, real Apertium for the text streams); the
test reaches into the app only to hold an admission slot, to compact the stream log, or to drive the breaker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from conftest import piper_wav, serve_in_loop

from lingua_fusion.config import Settings
from lingua_fusion.glossary import Term
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import CallContext, MtInput
from lingua_fusion.stream.breaker import STEPS
from lingua_fusion.stream.service import StreamService

WAIT_S = 30.0  # generous: a wait for something that must happen, never a speed bound


def settings_for(tmp: Path, **server: Any) -> Settings:
    s = Settings(state_dir=tmp)
    s.server.auth = False
    for k, v in server.items():
        setattr(s.server, k, v)
    return s


def serve(settings: Settings) -> contextlib.AbstractAsyncContextManager[tuple[str, Any]]:
    """A real server in this event loop: (host:port, app) (conftest.serve_in_loop)."""
    return serve_in_loop(settings, WAIT_S)


class Wire:
    """One raw WebSocket connection: everything the server sent, in order, and how it closed."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.got: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, host: str, start: dict[str, Any], key: str | None = None) -> Wire:
        from websockets.asyncio.client import connect

        headers = {"Authorization": f"Bearer {key}"} if key else None
        ws = await connect(f"ws://{host}/v1/streams", additional_headers=headers, open_timeout=WAIT_S)
        await ws.send(json.dumps(start))
        return cls(ws)

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                async with self._changed:
                    self.got.append(json.loads(raw))
                    self._changed.notify_all()
        async with self._changed:
            self.close_code = self.ws.close_code
            self._changed.notify_all()

    async def until(self, pred: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(lambda: pred(self.got))
        return self.got

    async def first(self, kind: str) -> dict[str, Any]:
        await self.until(lambda got: any(e["type"] == kind for e in got))
        return next(e for e in self.got if e["type"] == kind)

    async def closed(self) -> int:
        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(lambda: self.close_code is not None)
        assert self.close_code is not None
        return self.close_code

    async def send(self, **msg: Any) -> None:
        await self.ws.send(json.dumps(msg))

    async def hang_up(self) -> None:
        await self.ws.close()
        await self._reader

    def finals(self) -> list[int]:
        return [e["seq"] for e in self.got if e["type"] == "final"]


TEXTS = ["The dog is black.", "The house is big.", "The cat is small.", "The car is red.", "The sea is blue."]


def text_start(**kw: Any) -> dict[str, Any]:
    return {"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": False, "inputs": ["text"],
            **kw}


async def five_finals(host: str) -> dict[str, Any]:
    """A text stream that sent five finals, then lost its connection (no ``end``): its ``ready`` event."""
    w = await Wire.open(host, text_start())
    ready = await w.first("ready")
    for i, text in enumerate(TEXTS):
        await w.send(type="text", text=text, ts=float(i))
    await w.until(lambda got: len([e for e in got if e["type"] == "final"]) == len(TEXTS))
    assert w.finals() == [1, 2, 3, 4, 5]
    await w.hang_up()
    return ready


def resume(ready: dict[str, Any], last_seq: int) -> dict[str, Any]:
    return text_start(resume={"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                              "last_seq": last_seq})


# ---- exactly once, in order --------------------------------------------------------------------------------------
async def test_a_resume_sends_each_missed_final_exactly_once_on_the_wire(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        ready = await five_finals(host)
        # the stream is still live (the client only went away): resume after final 2, then end it
        w = await Wire.open(host, resume(ready, 2))
        greeting = await w.first("ready")
        assert greeting["resumed"] is True and greeting["last_seq"] == 5
        await w.send(type="end")
        assert await w.closed() == 1000
        assert w.finals() == [3, 4, 5]  # not 2 (the client had it), each once, in order
        assert [e["type"] for e in w.got] == ["ready", "final", "final", "final", "closed"]
        # the stream has ended: a resume replays from the log, says closed and hangs up
        for last_seq, expected in ((0, [1, 2, 3, 4, 5]), (4, [5]), (5, [])):
            w = await Wire.open(host, resume(ready, last_seq))
            assert await w.closed() == 1000
            assert w.finals() == expected, (last_seq, w.got)
            assert w.got[0]["type"] == "ready" and (w.got[-1]["type"], w.got[-1]["finals"]) == ("closed", 5)


async def test_replayed_finals_are_the_logged_ones(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        first = await Wire.open(host, text_start())
        ready = await first.first("ready")
        for i, text in enumerate(TEXTS[:3]):
            await first.send(type="text", text=text, ts=float(i))
        await first.until(lambda got: len([e for e in got if e["type"] == "final"]) == 3)
        sent = {e["seq"]: e for e in first.got if e["type"] == "final"}
        await first.hang_up()
        again = await Wire.open(host, resume(ready, 0))
        await again.until(lambda got: len([e for e in got if e["type"] == "final"]) == 3)
        for e in (e for e in again.got if e["type"] == "final"):
            assert (e["text"], e["source_text"], e["start"]) == (sent[e["seq"]]["text"], sent[e["seq"]]["source_text"],
                                                                  sent[e["seq"]]["start"])
        await again.hang_up()


async def test_a_resume_from_before_the_compacted_log_names_what_it_cannot_have(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    s.state.max_log_finals = 2  # compaction keeps a live stream's last 2 finals
    async with serve(s) as (host, app):
        ready = await five_finals(host)
        service: StreamService = app.state.streams
        done = await service.compact()
        assert done["finals_trimmed"] == 3
        for last_seq, gone, expected in ((0, "1..3", [4, 5]), (2, "3..3", [4, 5]), (3, None, [4, 5]),
                                         (4, None, [5])):
            w = await Wire.open(host, resume(ready, last_seq))
            await w.first("ready")
            n = len(expected)
            await w.until(lambda got, n=n: len([e for e in got if e["type"] == "final"]) == n)
            notices = [e for e in w.got if e["type"] == "error"]
            if gone is None:
                assert notices == [], (last_seq, w.got)
            else:
                assert [n["code"] for n in notices] == ["log_compacted"]
                assert f"finals {gone} " in notices[0]["message"], notices
                # the notice comes before the finals that are left
                assert [e["type"] for e in w.got[:2]] == ["ready", "error"]
            assert w.finals() == expected, (last_seq, w.got)
            await w.hang_up()


# ---- overload and limits -----------------------------------------------------------------------------------------
async def test_translate_refuses_with_429_and_retry_after_when_full(tmp_path: Path) -> None:
    s = settings_for(tmp_path, max_concurrent_requests=1, max_waiting_requests=1)
    async with serve(s) as (host, app), httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as client:
        admission = app.state.ctx.admission
        form = {"text": "The dog is black.", "source_lang": "en", "target_lang": "es"}
        async with admission.slot():  # the one translation slot is busy
            waiting = asyncio.create_task(client.post("/v1/translate", data=form))
            async with asyncio.timeout(WAIT_S):  # the next request waits in the bounded queue ...
                # (the server offers no event for it: its gauge is what a client can see)
                while "linguafusion_requests_waiting 1.0" not in (await client.get("/metrics")).text:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            refused = await client.post("/v1/translate", data=form)  # ... and the one after is refused
            assert refused.status_code == 429, refused.text
            assert refused.headers["Retry-After"] == "2"
            assert refused.json()["error"]["code"] == "overloaded"
            assert not waiting.done()
        served = await waiting  # the queued one is served once the slot is free
        assert served.status_code == 200 and served.json()["text"] == "El perro es negro."
        again = await client.post("/v1/translate", data=form)
        assert again.status_code == 200
        metrics = (await client.get("/metrics")).text
        assert "linguafusion_rejected_total 1.0" in metrics


async def test_a_key_holds_at_most_its_stream_limit(tmp_path: Path) -> None:
    s = settings_for(tmp_path, auth=True, max_streams_per_key=2)
    async with serve(s) as (host, app):
        store = app.state.ctx.store
        key_a, _ = store.create_key("a", ("translate",))
        key_b, _ = store.create_key("b", ("translate",))
        held = [await Wire.open(host, text_start(), key_a) for _ in range(2)]
        for w in held:
            await w.first("ready")
        third = await Wire.open(host, text_start(), key_a)
        assert await third.closed() == 4429
        assert [e["type"] for e in third.got] == ["error"] and third.got[0]["code"] == "overloaded"
        other = await Wire.open(host, text_start(), key_b)  # the limit is per key: another key still opens
        await other.first("ready")
        await held[0].send(type="end")
        assert await held[0].closed() == 1000
        again = await Wire.open(host, text_start(), key_a)  # an ended stream gave its place back
        await again.first("ready")
        for w in (held[1], other, again):
            await w.hang_up()


async def test_the_per_stream_engine_needs_an_admin_key(tmp_path: Path) -> None:
    s = settings_for(tmp_path, auth=True)
    async with serve(s) as (host, app):
        store = app.state.ctx.store
        user, _ = store.create_key("user", ("translate",))
        admin, _ = store.create_key("admin", ("translate", "admin"))
        refused = await Wire.open(host, text_start(engine="per-stream"), user)
        assert await refused.closed() == 4403
        assert [(e["type"], e["code"]) for e in refused.got] == [("error", "forbidden")]
        allowed = await Wire.open(host, text_start(engine="per-stream"), admin)
        await allowed.first("ready")
        await allowed.send(type="text", text="The dog is black.", ts=0.0)
        final = await allowed.first("final")
        assert final["text"] == "El perro es negro."
        front = app.state.stream_front  # served by the baseline, not the batched service
        assert front.per_stream.sessions and not front.batched.sessions
        await allowed.hang_up()
        bogus = await Wire.open(host, text_start(engine="fast"), admin)
        assert await bogus.closed() == 4400


async def test_revoking_a_key_over_rest_ends_its_per_stream_baseline_streams_at_once(tmp_path: Path) -> None:
    """``DELETE /v1/keys/{id}`` ends the key's live streams at once (4401), those on the per-stream baseline beside
    the batched service too (stream/front.py), and counts them in ``streams_closed``."""
    s = settings_for(tmp_path, auth=True)
    s.server.key_check_interval_s = 600.0  # the revocation watch would end it too, later: this is the route's doing
    async with serve(s) as (host, app), httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as client:
        store = app.state.ctx.store
        bench, bench_key = store.create_key("bench", ("translate", "admin"))
        admin, _ = store.create_key("admin", ("translate", "admin"))
        wire = await Wire.open(host, text_start(engine="per-stream"), bench)
        await wire.first("ready")
        r = await client.delete(f"/v1/keys/{bench_key.key_id}", headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200 and r.json()["streams_closed"] == 1, r.text
        assert await wire.closed() == 4401


async def test_a_new_stream_of_a_breached_class_is_refused_until_the_class_recovers(tmp_path: Path) -> None:
    """While a class's streams miss its latency target (its SLO breaker has moved down), a new stream of that class
    is refused (4429 ``overloaded``, saying which class and level) instead of making it worse; another class opens,
    and once the class is restored new streams open again."""
    s = settings_for(tmp_path, breaker_window_s=1.0, breaker_k=1)
    async with serve(s) as (host, app):
        service: StreamService = app.state.streams
        t = [1000.0]
        service.executor.clock = lambda: t[0]
        live = await Wire.open(host, text_start(slo="standard"))
        await live.first("ready")
        service.caption_done("standard", 30.0)
        t[0] += 1.0
        service.caption_done("standard", 30.0)  # the first window breached: level 1
        assert service.breaker.level("standard") == 1
        refused = await Wire.open(host, text_start(slo="standard"))
        assert await refused.closed() == 4429
        err = next(e for e in refused.got if e["type"] == "error")
        assert err["code"] == "overloaded"
        assert err["details"] == {"slo": "standard", "breaker_level": 1, "scope": "class"}
        other = await Wire.open(host, text_start(slo="interactive"))
        await other.first("ready")
        for _ in range(3):  # healthy windows: the class is restored
            t[0] += 1.0
            service.caption_done("standard", 0.1)
        assert service.breaker.level("standard") == 0
        again = await Wire.open(host, text_start(slo="standard"))
        await again.first("ready")
        service.caption_done("standard", 30.0)
        t[0] += 1.0
        service.caption_done("standard", 30.0)  # breached again: level 1, refusing
        assert service.breaker.level("standard") == 1
        refused = await Wire.open(host, text_start(slo="standard"))
        assert await refused.closed() == 4429
        t[0] += 62.0  # then no captions for a minute past the last window's (the class went quiet)
        quiet = await Wire.open(host, text_start(slo="standard"))
        await quiet.first("ready")  # not locked out: the breaker restored the quiet class
        assert service.breaker.level("standard") == 0
        for w in (live, other, again, quiet):
            await w.hang_up()


async def test_one_keys_late_captions_refuse_that_key_and_never_another_key(tmp_path: Path) -> None:
    """Issue 29: one key's room stream of long captions in four languages ran 27 s late, moved the shared class
    down, and every other key's new streams were refused for a minute. Now the key that misses is refused (scope
    "key") and degraded; another key (here the no-auth key, "anonymous") opens and is not told to degrade."""
    s = settings_for(tmp_path, breaker_window_s=1.0, breaker_k=1)
    async with serve(s) as (host, app):
        service: StreamService = app.state.streams
        t = [1000.0]
        service.executor.clock = lambda: t[0]
        live = await Wire.open(host, text_start(slo="standard"))
        await live.first("ready")
        service.caption_done("standard", 27.0, "key-a")
        service.caption_done("standard", 0.4, "anonymous")
        t[0] += 1.0
        service.caption_done("standard", 27.0, "key-a")  # the first window breached, for the class and for key-a
        assert service.breaker.level("standard") == 1 and service.breaker.keys_down("standard") == ["key-a"]
        assert not service.degraded("standard", "drop_partials", "anonymous")
        assert service.degraded("standard", "drop_partials", "key-a")
        opened = await Wire.open(host, text_start(slo="standard"))  # the old server refused this one
        await opened.first("ready")
        assert not any(e["type"] == "degraded" for e in live.got)  # nor told the live one of key-a's doing
        service.caption_done("standard", 30.0, "anonymous")
        t[0] += 1.0
        service.caption_done("standard", 30.0, "anonymous")  # now this key misses its own target too
        refused = await Wire.open(host, text_start(slo="standard"))
        assert await refused.closed() == 4429
        err = next(e for e in refused.got if e["type"] == "error")
        assert err["details"] == {"slo": "standard", "breaker_level": 1, "scope": "key"}
        for w in (live, opened):
            await w.hang_up()


async def test_shedding_takes_the_least_important_stream_of_the_breached_class_only(tmp_path: Path) -> None:
    s = settings_for(tmp_path, breaker_window_s=1.0, breaker_k=1)
    async with serve(s) as (host, app):
        service: StreamService = app.state.streams
        t = [1000.0]
        service.executor.clock = lambda: t[0]
        wires = {}
        for name, slo, importance in (("low", "standard", 0.2), ("mid", "standard", 0.6),
                                      ("other", "interactive", 0.1)):
            wires[name] = await Wire.open(host, text_start(slo=slo, importance=importance))
            await wires[name].first("ready")
        service.caption_done("standard", 30.0)
        for _ in STEPS:  # each window breaches: one step down per window, the last one sheds
            t[0] += 1.0
            service.caption_done("standard", 30.0)
        assert await wires["low"].closed() == 4429
        shed = [e for e in wires["low"].got if e["type"] == "error"]
        assert len(shed) == 1 and shed[0]["code"] == "overloaded"
        await wires["mid"].until(lambda got: any(e["type"] == "degraded" and e["level"] == len(STEPS) for e in got))
        await wires["mid"].send(type="text", text="The dog is black.", ts=0.0)
        assert (await wires["mid"].first("final"))["seq"] == 1  # still served
        await wires["other"].send(type="text", text="The dog is black.", ts=0.0)
        await wires["other"].first("final")
        assert not any(e["type"] in ("degraded", "error") for e in wires["other"].got)  # another class: untouched
        assert wires["mid"].close_code is None and wires["other"].close_code is None
        for name in ("mid", "other"):
            await wires[name].hang_up()


# ---- glossaries: each stream's own, even inside one batch ----------------------------------------------------------
async def test_a_cross_stream_mt_batch_applies_each_streams_own_glossary(engine: Any) -> None:
    executor = Executor(engine.registry, Settings())
    key = ModelKey.mt("en", "es")
    bank = (Term("bank", "orilla"),)
    text = "The bank is closed."
    try:
        await executor.run(key, MtInput("Hello.", ()), CallContext("warm"))  # the model is loaded: one batch next
        before = executor.scheduler.stats.batches
        calls = [(f"s{i}", bank if i % 2 == 0 else ()) for i in range(4)]
        outs = await asyncio.gather(*(executor.run(key, MtInput(text, terms), CallContext(sid))
                                      for sid, terms in calls))
        assert executor.scheduler.stats.batches == before + 1  # the four streams' texts went in one MT call
    finally:
        await executor.close()
    for (sid, terms), out in zip(calls, outs, strict=True):
        if terms:
            assert "orilla" in out and "banco" not in out, (sid, out)
        else:
            assert "orilla" not in out and "banco" in out, (sid, out)
        assert "[9" not in out  # no placeholder ever reaches a caption


# ---- speech and confidence in a live stream ------------------------------------------------------------------------
async def test_a_stream_with_speech_sends_audio_for_each_caption(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        w = await Wire.open(host, text_start(speech=True))
        await w.first("ready")
        await w.send(type="text", text="The dog is black.", ts=0.0)
        await w.send(type="end")
        assert await w.closed() == 1000
    final = next(e for e in w.got if e["type"] == "final")
    speech = [e for e in w.got if e["type"] == "speech"]
    assert len(speech) == 1 and speech[0]["seq"] == final["seq"] == 1 and speech[0]["lang"] == "es"
    wav = base64.b64decode(speech[0]["audio_base64"])
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE" and len(wav) > 8000  # real audio, not a header


async def test_speech_below_the_streams_confidence_floor_is_gated_not_translated(tmp_path: Path) -> None:
    import io
    import wave

    import numpy as np

    with wave.open(io.BytesIO(piper_wav("The house is very big."))) as f:
        rate = f.getframerate()
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16)
    idx = np.round(np.arange(0, len(pcm), rate / 16000)).astype(int)  # to 16 kHz
    audio = np.r_[pcm[idx[idx < len(pcm)]], np.zeros(16000, dtype=np.int16)].astype("<i2").tobytes()
    async with serve(settings_for(tmp_path)) as (host, _app):
        results = {}
        for floor in (1.0, 0.0):
            w = await Wire.open(host, {"type": "start", "source_lang": "en", "target_langs": ["es"],
                                       "partials": False, "inputs": ["audio"], "min_confidence": floor})
            await w.first("ready")
            await w.send(type="audio", data=base64.b64encode(audio).decode(), ts=0.0)
            await w.send(type="end")
            assert await w.closed() == 1000
            results[floor] = [e for e in w.got if e["type"] == "final"]
    gated, passed = results[1.0], results[0.0]
    assert len(gated) == 1 and gated[0]["gated"] == ["asr"] and gated[0]["text"] == ""
    assert gated[0]["translations"] == {"es": ""} and "below 1.0" in gated[0]["note"]
    assert len(passed) == 1 and "gated" not in passed[0] and "casa" in passed[0]["text"].lower()
