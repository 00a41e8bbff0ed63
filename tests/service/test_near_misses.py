"""Issue 29: tests that catch near misses. A reviewer's planted bugs survived where every test used a value far from
the edge: a wrong secret that was wholly wrong, one class of three, one room or glossary, a field equal to what the
server would have found anyway, a size well inside or far past a limit, a stream whose last piece did not matter.
Each test here sits on the edge: a secret one character off, each class's own target, two of a thing at once, a
field that differs from the detected / default value, exactly the limit and one past it, the very last piece.

Servers are real (``create_app`` under uvicorn in the test's event loop, tests/service/test_promises.py ``serve``; real
Apertium for text); the breaker test drives the clock, the last-piece test runs a session on fakes (tests/fakes.py)
to see the samples the recogniser got. Each kind was checked against one planted one-line bug (reverted; the
committed source is unchanged), with what the suite before this file said:

1. A secret that almost matches: planted ``state/users.py key_digest``: ``secret[:24]`` (an API key is looked up by
   its first 24 characters). Old suite: passed. Here: test_an_api_key_that_almost_matches_is_refused.
2. One class of three: planted ``stream/service.py``: every class's breaker target ``SLO_CLASSES["standard"]``.
   Old suite: passed (its breaker tests use "standard"). Here: test_each_class_is_held_to_its_own_latency_target
   (interactive and batch).
3. Two of a thing: planted ``api/translate.py``: ``glossary_id`` ignored, the key's latest glossary applied. Old
   suite: passed (one glossary per key). Here: test_of_two_glossaries_of_one_key_the_one_named_is_applied.
4. A field equal to the detected value: planted ``api/translate.py``: ``source_lang`` ignored (always detected),
   and ``stream/jobs.py commit``: ``ModelKey.asr("en")`` for the stream's own language. Old suite: caught both
   (test_bad_input unsupported_pair_en_ja, test_sdk_server; test_streaming
   test_cli_stream_detects_the_spoken_language). Here: test_a_declared_source_language_is_used_where_detection_
   would_find_another, test_a_stream_s_speech_goes_to_the_recogniser_of_its_declared_language (no models).
5. An exact boundary: planted ``api/ws.py _read``: ``>=`` for ``>`` against ``server.max_ws_message_bytes``. Old
   suite: passed. Here: test_a_stream_message_of_exactly_max_ws_message_bytes_is_taken_one_more_is_refused.
6. The last piece of a stream: planted ``stream/session.py end``: the flush commits up to the audio the VAD has
   seen (``ingest.vad_pos``), not to the end of the audio received. Old suite: passed. Here:
   test_the_audio_just_before_end_reaches_the_recogniser.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fakes import FakePort, drain, session
from test_promises import Wire, serve, settings_for, text_start

from lingua_fusion.api.shared_tickets import SharedTicketBook
from lingua_fusion.api.tickets import TicketBook
from lingua_fusion.errors import AuthenticationError
from lingua_fusion.rooms.bus import LocalRoomBus
from lingua_fusion.rooms.directory import LocalRoomDirectory
from lingua_fusion.rooms.service import RoomService
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import SLO_CLASSES, AsrInput
from lingua_fusion.stream.protocol import StreamSpec
from lingua_fusion.stream.service import StreamService

WAIT_S = 30.0


def near_misses(secret: str) -> list[str]:
    """Secrets one step from ``secret``: the last, a middle or the first character changed, one dropped, one added
    (at the end, in the middle), its case changed, a prefix of it. (Not spaces around it: HTTP trims a header's
    value, so `` sk_...`` is the key itself.)"""
    def other(c: str) -> str:
        return "A" if c != "A" else "B"

    mid = len(secret) // 2
    misses = [secret[:-1] + other(secret[-1]), secret[:mid] + other(secret[mid]) + secret[mid + 1:],
              other(secret[0]) + secret[1:], secret[:-1], secret + "x", secret.swapcase(), secret.upper(),
              secret[: len(secret) * 2 // 3], secret[:mid] + "x" + secret[mid:]]
    assert secret not in misses
    return misses


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- 1. a secret that almost matches ------------------------------------------------------------------------------
async def test_an_api_key_that_almost_matches_is_refused(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path, auth=True)) as (host, app):
        key, _ = app.state.ctx.store.create_key("user", ("translate",))
        async with httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
            assert (await c.get("/v1/glossaries", headers=auth(key))).status_code == 200
            for miss in near_misses(key):
                for headers in (auth(miss), {"X-API-Key": miss}):
                    r = await c.get("/v1/glossaries", headers=headers)
                    assert r.status_code == 401, (miss, r.text)
                    assert r.json()["error"]["code"] == "unauthenticated"
        for miss in near_misses(key)[:3]:  # a stream's handshake too
            w = await Wire.open(host, text_start(), miss)
            assert await w.closed() == 4401, miss


async def _finals_then_hang_up(host: str, texts: list[str]) -> dict[str, Any]:
    w = await Wire.open(host, text_start())
    ready = await w.first("ready")
    for i, text in enumerate(texts):
        await w.send(type="text", text=text, ts=float(i))
    await w.until(lambda got: len([e for e in got if e["type"] == "final"]) == len(texts))
    await w.hang_up()
    return ready


def _resume(stream_id: str, token: str, last_seq: int = 0) -> dict[str, Any]:
    return text_start(resume={"stream_id": stream_id, "resume_token": token, "last_seq": last_seq})


async def test_a_resume_token_that_almost_matches_resumes_nothing(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        ready = await _finals_then_hang_up(host, ["The dog is black."])
        for miss in near_misses(ready["resume_token"]):
            w = await Wire.open(host, _resume(ready["stream_id"], miss))
            assert await w.closed() == 4401, miss
            assert not any(e["type"] == "final" for e in w.got)  # nothing of the stream leaks to a wrong token
        right = await Wire.open(host, _resume(ready["stream_id"], ready["resume_token"]))
        await right.first("ready")  # the near misses did not lock the right token out
        await right.until(lambda got: any(e["type"] == "final" for e in got))
        await right.hang_up()


@pytest.mark.parametrize("kind", ["memory", "shared"])
def test_a_stream_ticket_that_almost_matches_is_refused_and_leaves_the_ticket_usable(kind: str,
                                                                                     tmp_path: Path) -> None:
    book: Any = TicketBook() if kind == "memory" else SharedTicketBook(tmp_path / "tickets.sqlite3")
    ticket = book.issue("key_a", False, now=0.0)
    assert ticket is not None
    for miss in near_misses(ticket.token):
        with pytest.raises(AuthenticationError):
            book.redeem(miss, now=1.0)
    assert book.redeem(ticket.token, now=1.0).key_id == "key_a"
    with pytest.raises(AuthenticationError):  # once
        book.redeem(ticket.token, now=1.0)


async def test_a_listener_token_that_almost_matches_opens_no_room() -> None:
    rooms = RoomService(LocalRoomBus(), LocalRoomDirectory(), check_pair=lambda s, t: None,
                        low_confidence=lambda s, t: False)
    room, token = await rooms.create("key_owner", "en")
    room.state = "live"
    await rooms.directory.save(room)
    for miss in near_misses(token):
        with pytest.raises(AuthenticationError):
            await rooms.join(room.room_id, miss, ["es"])
    listener = await rooms.join(room.room_id, token, ["es"])
    assert listener is not None


# ---- 2. each class's own value ------------------------------------------------------------------------------------
@pytest.mark.parametrize("slo", sorted(SLO_CLASSES))
async def test_each_class_is_held_to_its_own_latency_target(slo: str, tmp_path: Path) -> None:
    """Captions at half the class's caption target keep it serving; at 1.2 x its target the class's SLO breaker
    moves down and a new stream of that class is refused, naming the class. Each class against its own target (1 s,
    3 s, 30 s): half of batch's is far over interactive's, 1.2 x interactive's far under standard's."""
    target = SLO_CLASSES[slo]
    async with serve(settings_for(tmp_path, breaker_window_s=1.0, breaker_k=1)) as (host, app):
        service: StreamService = app.state.streams
        t = [1000.0]
        service.executor.clock = lambda: t[0]
        for _ in range(3):  # two windows closed at half the target: healthy
            service.caption_done(slo, 0.5 * target)
            t[0] += 1.0
        assert service.breaker.level(slo) == 0
        fine = await Wire.open(host, text_start(slo=slo))
        await fine.first("ready")
        service.caption_done(slo, 1.2 * target)  # closes the last healthy window ...
        t[0] += 1.0
        service.caption_done(slo, 1.2 * target)  # ... and this one a window at 1.2 x the target: breached (k = 1)
        assert service.breaker.level(slo) == 1
        refused = await Wire.open(host, text_start(slo=slo))
        assert await refused.closed() == 4429
        err = next(e for e in refused.got if e["type"] == "error")
        assert err["code"] == "overloaded" and err["details"]["slo"] == slo
        await fine.hang_up()


# ---- 3. two of a thing at once ------------------------------------------------------------------------------------
async def _glossary(c: httpx.AsyncClient, key: str | None, terms: str) -> str:
    r = await c.post("/v1/glossaries", data={"terms": terms, "name": terms}, headers=auth(key) if key else None)
    assert r.status_code == 201, r.text
    return str(r.json()["glossary_id"])


async def test_of_two_glossaries_of_one_key_the_one_named_is_applied(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        first = await _glossary(c, None, "house,mansión")
        second = await _glossary(c, None, "house,hogar")  # the latest: what a request naming none gets
        for gid, want, not_want in ((first, "mansión", "hogar"), (second, "hogar", "mansión")):
            r = await c.post("/v1/translate", data={"text": "The house is big.", "source_lang": "en",
                                                    "target_lang": "es", "enable_glossary": "true",
                                                    "glossary_id": gid})
            assert r.status_code == 200, r.text
            assert want in r.json()["text"] and not_want not in r.json()["text"], (gid, r.json()["text"])


async def test_two_streams_of_one_key_each_keep_their_own_glossary(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        async with httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
            first = await _glossary(c, None, "house,mansión")
            second = await _glossary(c, None, "house,hogar")
        a = await Wire.open(host, text_start(glossary_id=first))
        b = await Wire.open(host, text_start(glossary_id=second))
        await a.first("ready")
        await b.first("ready")
        for w in (b, a):
            await w.send(type="text", text="The house is big.", ts=0.0)
        fa, fb = await a.first("final"), await b.first("final")
        assert "mansión" in fa["translations"]["es"] and "hogar" not in fa["translations"]["es"], fa
        assert "hogar" in fb["translations"]["es"] and "mansión" not in fb["translations"]["es"], fb
        for w in (a, b):
            await w.hang_up()


async def test_two_keys_glossaries_stay_apart(tmp_path: Path) -> None:
    """Key B can neither see, read, use nor delete key A's glossary, though it holds one of its own."""
    async with serve(settings_for(tmp_path, auth=True)) as (host, app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        key_a, _ = app.state.ctx.store.create_key("a", ("translate",))
        key_b, _ = app.state.ctx.store.create_key("b", ("translate",))
        of_a = await _glossary(c, key_a, "house,mansión")
        of_b = await _glossary(c, key_b, "house,hogar")
        listed = (await c.get("/v1/glossaries", headers=auth(key_b))).json()["glossaries"]
        assert [g["glossary_id"] for g in listed] == [of_b]
        assert (await c.get(f"/v1/glossaries/{of_a}", headers=auth(key_b))).status_code == 404
        used = await c.post("/v1/translate", headers=auth(key_b), data={
            "text": "The house is big.", "source_lang": "en", "target_lang": "es", "enable_glossary": "true",
            "glossary_id": of_a})
        assert used.status_code == 404 and "mansión" not in used.text
        assert (await c.delete(f"/v1/glossaries/{of_a}", headers=auth(key_b))).status_code == 404
        assert (await c.get(f"/v1/glossaries/{of_a}", headers=auth(key_a))).status_code == 200  # still there


async def test_two_streams_resume_tokens_do_not_cross(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        a = await _finals_then_hang_up(host, ["The dog is black."])
        b = await _finals_then_hang_up(host, ["The cat is small."])
        crossed = await Wire.open(host, _resume(a["stream_id"], b["resume_token"]))
        assert await crossed.closed() == 4401
        assert not any(e["type"] == "final" for e in crossed.got)
        for ready, text in ((a, "perro"), (b, "gato")):  # each token resumes its own stream, with its own finals
            w = await Wire.open(host, _resume(ready["stream_id"], ready["resume_token"]))
            final = await w.first("final")
            assert text in final["translations"]["es"].lower(), final
            await w.hang_up()


# ---- 4. a field that differs from what the server would find ------------------------------------------------------
SPANISH = "Buenos días, la casa es grande."


async def test_a_declared_source_language_is_used_where_detection_would_find_another(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        detected = (await c.post("/v1/translate", data={"text": SPANISH, "target_lang": "en"})).json()
        assert detected["source_lang"] == "es"  # what detection finds: the declaration below says otherwise
        r = await c.post("/v1/translate", data={"text": SPANISH, "source_lang": "ca", "target_lang": "en"})
        assert r.status_code == 200, r.text
        assert r.json()["source_lang"] == "ca" and r.json()["route"].startswith("apertium ca->"), r.json()


async def test_a_stream_s_speech_goes_to_the_recogniser_of_its_declared_language() -> None:
    """A Spanish stream (not English, the language most tests speak and the one most models know): every
    committed utterance is heard by the Spanish recogniser and translated es -> en."""
    port = FakePort(asr_text="la casa es grande")
    s = session(port, spec=StreamSpec(source_lang="es", targets=["en", "ca"]))
    s.start()
    await s.feed_audio((np.full(16000, 0.5 * 32767)).astype("<i2").tobytes())
    await s.feed_audio(bytes(2 * 16000))  # a second of silence: the utterance is committed
    await s.end()
    finals = [e for e in await drain(s) if e["type"] == "final"]
    assert finals and finals[0]["translations"] == {"en": "LA CASA ES GRANDE", "ca": "LA CASA ES GRANDE"}
    heard = {k for k, _, _ in port.calls if k.task in ("asr", "mt")}
    assert heard == {ModelKey.asr("es"), ModelKey.mt("es", "en"), ModelKey.mt("es", "ca")}, heard


async def test_a_stream_translates_into_the_targets_it_named_not_a_default(tmp_path: Path) -> None:
    async with serve(settings_for(tmp_path)) as (host, _app):
        w = await Wire.open(host, text_start(target_langs=["ca", "fr"]))
        await w.first("ready")
        await w.send(type="text", text="The house is big.", ts=0.0)
        final = await w.first("final")
        assert set(final["translations"]) == {"ca", "fr"}, final
        assert "gran" in final["translations"]["ca"] and "grande" in final["translations"]["fr"], final
        await w.hang_up()


# ---- 5. exactly the limit, and one past it ------------------------------------------------------------------------
def _limited(tmp: Path, **limits: Any) -> Any:
    s = settings_for(tmp)
    for k, v in limits.items():
        setattr(s.limits, k, v)
    return s


async def test_a_text_of_exactly_max_text_chars_is_translated_one_more_is_refused(tmp_path: Path) -> None:
    text = "The house is big. " * 3  # 54 characters
    async with serve(_limited(tmp_path, max_text_chars=len(text))) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        ok = await c.post("/v1/translate", data={"text": text, "source_lang": "en", "target_lang": "es"})
        assert ok.status_code == 200 and "casa" in ok.json()["text"], ok.text
        over = await c.post("/v1/translate", data={"text": text + "x", "source_lang": "en", "target_lang": "es"})
        assert over.status_code == 413 and over.json()["error"]["details"]["limit"] == "max_text_chars", over.text


async def test_a_stream_text_of_exactly_max_text_chars_is_translated_one_more_is_refused(tmp_path: Path) -> None:
    text = "The house is big. " * 3
    async with serve(_limited(tmp_path, max_text_chars=len(text))) as (host, _app):
        w = await Wire.open(host, text_start())
        await w.first("ready")
        await w.send(type="text", text=text, ts=0.0)
        assert "casa" in (await w.first("final"))["translations"]["es"]
        await w.send(type="text", text=text + "x", ts=1.0)
        assert await w.closed() == 4413
        assert [e["code"] for e in w.got if e["type"] == "error"] == ["too_large"]


async def test_a_glossary_of_exactly_max_glossary_terms_is_kept_one_more_is_refused(tmp_path: Path) -> None:
    terms = [f"word{i},palabra{i}" for i in range(6)]
    async with serve(_limited(tmp_path, max_glossary_terms=5)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        ok = await c.post("/v1/glossaries", data={"terms": "\n".join(terms[:5])})
        assert ok.status_code == 201 and ok.json()["terms"] == 5, ok.text
        over = await c.post("/v1/glossaries", data={"terms": "\n".join(terms)})
        assert over.status_code == 413 and over.json()["error"]["code"] == "too_large", over.text
        assert len((await c.get("/v1/glossaries")).json()["glossaries"]) == 1


async def test_a_key_keeps_exactly_max_glossaries_per_key_and_no_more(tmp_path: Path) -> None:
    async with serve(_limited(tmp_path, max_glossaries_per_key=3)) as (host, _app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        for i in range(3):
            await _glossary(c, None, f"house{i},casa{i}")
        over = await c.post("/v1/glossaries", data={"terms": "house,casa"})
        assert over.status_code == 403 and over.json()["error"]["code"] == "quota_exceeded", over.text


async def test_a_json_body_of_exactly_max_json_bytes_is_read_one_more_is_refused(tmp_path: Path) -> None:
    limit = 1024
    async with serve(_limited(tmp_path, max_json_bytes=limit)) as (host, app), \
            httpx.AsyncClient(base_url=f"http://{host}", timeout=WAIT_S) as c:
        admin, _ = app.state.ctx.store.create_key("admin", ("translate", "admin"))
        head = json.dumps({"name": "padded"}).encode()[:-1]
        exact = head + b" " * (limit - len(head) - 1) + b"}"
        assert len(exact) == limit
        h = {**auth(admin), "Content-Type": "application/json"}
        ok = await c.post("/v1/keys", content=exact, headers=h)
        assert ok.status_code == 201 and ok.json()["api_key"].startswith("sk_"), ok.text
        over = await c.post("/v1/keys", content=head + b" " * (limit - len(head)) + b"}", headers=h)
        assert over.status_code == 413 and over.json()["error"]["code"] == "too_large", over.text


async def test_a_stream_message_of_exactly_max_ws_message_bytes_is_taken_one_more_is_refused(
        tmp_path: Path) -> None:
    limit = 4096
    s = settings_for(tmp_path, max_ws_message_bytes=limit)
    async with serve(s) as (host, _app):
        ok = await Wire.open(host, text_start(inputs=["audio"]))
        await ok.first("ready")
        await ok.ws.send(b"\0" * limit)  # 128 ms of silence: exactly the limit
        await ok.send(type="end")
        assert await ok.closed() == 1000
        assert not [e for e in ok.got if e["type"] == "error"], ok.got
        over = await Wire.open(host, text_start(inputs=["audio"]))
        await over.first("ready")
        await over.ws.send(b"\0" * (limit + 1))
        assert await over.closed() == 4413
        assert [e["code"] for e in over.got if e["type"] == "error"] == ["too_large"]


# ---- 6. the last piece of a stream --------------------------------------------------------------------------------
async def test_the_audio_just_before_end_reaches_the_recogniser() -> None:
    """Speech up to the very end (no silence before ``end``), its last message shorter than one VAD window: the
    recogniser gets every sample, the last message's included, and the caption ends where the audio does."""
    port = FakePort(asr_text="the end of the talk")
    s = session(port)
    s.start()
    body = (np.full(16000, 0.5 * 32767)).astype("<i2").tobytes()  # 1 s of loud audio
    last = (np.full(300, 0.25 * 32767)).astype("<i2").tobytes()  # 300 samples, a different level
    await s.feed_audio(body)
    await s.feed_audio(last)
    await s.end()
    events = await drain(s)
    finals = [e for e in events if e["type"] == "final"]
    assert [f["text"] for f in finals] == ["THE END OF THE TALK"]  # the fake MT upper-cases
    assert finals[-1]["end"] == pytest.approx(16300 / 16000, abs=1e-3)
    heard = [p.audio for k, p, _ in port.calls if k.task == "asr" and isinstance(p, AsrInput)]
    tail = np.concatenate(heard)[-300:]
    assert np.allclose(tail, 0.25, atol=1e-3), tail[-5:]


async def test_the_last_text_before_end_gets_its_final_before_closed(tmp_path: Path) -> None:
    texts = ["The dog is black.", "The cat is small.", "The sea is blue."]
    async with serve(settings_for(tmp_path)) as (host, _app):
        w = await Wire.open(host, text_start())
        await w.first("ready")
        for i, text in enumerate(texts):
            await w.send(type="text", text=text, ts=float(i))
        await w.send(type="end")  # at once after the last text
        assert await w.closed() == 1000
        kinds = [e["type"] for e in w.got]
        assert kinds[-1] == "closed" and kinds.count("final") == 3, kinds
        finals = [e for e in w.got if e["type"] == "final"]
        assert "mar" in finals[-1]["translations"]["es"], finals[-1]
        assert next(e for e in w.got if e["type"] == "closed")["finals"] == 3

