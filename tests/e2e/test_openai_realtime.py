"""Issue 14: OpenAI's Realtime API transcription sessions on WS /v1/realtime, driven by the official ``openai``
package's realtime client (GA and beta) against a real server: a speech file streamed as pcm16 24 kHz gives
speech_started / speech_stopped / committed / delta / completed events with the right transcripts, on the stream
engine (admission, captions on /metrics); manual commits, translations (our extension), G.711 audio and the
errors a client can cause. The audio conversion and the session's settings are tested alone at the end."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import subprocess
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from conftest import BIN, free_port, piper_wav, start_server, stop_server

from lingua_fusion.api.openai_realtime_audio import ULAW, Converter
from lingua_fusion.api.openai_realtime_events import BETA, GA, SessionConfig
from lingua_fusion.errors import InvalidParameter, NotFound

pytestmark = pytest.mark.slow
FIRST, SECOND = "Good morning everyone. Today we talk about the school budget.", "The house is very big."
TIMEOUT_S = 120.0
COMPLETED = "conversation.item.input_audio_transcription.completed"
METRICS_TOKEN = "realtime-test-scrape-token"  # server.metrics_token: /metrics with auth on (the key is no admin)


@dataclass
class Api:
    url: str
    key: str
    state: Path

    def client(self, key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key or self.key, max_retries=0)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    state = tmp_path_factory.mktemp("realtime-state")
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    url, proc = start_server(state, port=free_port(), env={"LINGUAFUSION_SERVER__METRICS_TOKEN": METRICS_TOKEN})
    yield Api(url, key, state)
    stop_server(proc)


def pcm(wav: bytes, rate: int) -> bytes:
    """A WAV's speech as PCM16 mono at ``rate`` (PyAV's resampler: not the server's own)."""
    import av

    with av.open(io.BytesIO(wav)) as c:
        r = av.AudioResampler(format="s16", layout="mono", rate=rate)
        return b"".join(bytes(f.planes[0])[: f.samples * 2] for fr in c.decode(audio=0) for f in r.resample(fr))


def silence(seconds: float, rate: int = 24000) -> bytes:
    return b"\0\0" * int(seconds * rate)


@pytest.fixture(scope="module")
def talk() -> bytes:
    """Two sentences with a pause between them and after them, pcm16 24 kHz (what OpenAI's API takes)."""
    return pcm(piper_wav(FIRST), 24000) + silence(1.2) + pcm(piper_wav(SECOND), 24000) + silence(1.2)


def transcription(turn_detection: dict[str, Any] | None = None, language: str = "en",
                  **extension: Any) -> dict[str, Any]:
    session: dict[str, Any] = {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000},
        "transcription": {"model": "gpt-4o-transcribe", "language": language},
        "turn_detection": turn_detection}}}
    if extension:
        session["linguafusion"] = extension
    return session


async def play(conn: Any, audio: bytes, bytes_per_s: int = 48000, chunk_s: float = 0.1) -> None:
    """Append ``audio`` in 100 ms pieces, four times faster than real time."""
    step = int(bytes_per_s * chunk_s) // 2 * 2
    for i in range(0, len(audio), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i:i + step]).decode())
        await asyncio.sleep(chunk_s / 4)


async def collect(conn: Any, done: Callable[[list[Any]], bool]) -> list[Any]:
    events: list[Any] = []

    async def read() -> None:
        async for e in conn:
            events.append(e)
            if done(events):
                return

    await asyncio.wait_for(read(), TIMEOUT_S)
    return events


def of(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


def words(text: str) -> list[str]:
    return re.findall(r"[a-záéíóúñ]+", text.lower())


def heard(*expected: str) -> Callable[[list[Any]], bool]:
    """Done when the completed transcripts hold every expected word."""
    def done(evs: list[Any]) -> bool:
        said = set(words(" ".join(e.transcript for e in of(evs, COMPLETED))))
        return all(w in said for w in expected)
    return done


# ---- the GA client, server VAD ------------------------------------------------------------------------------
async def test_streamed_speech_gives_items_with_openais_events(api: Api, talk: bytes) -> None:
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        await conn.session.update(session=transcription({"type": "server_vad", "silence_duration_ms": 500}))
        updated = await conn.recv()
        assert updated.type == "session.updated"
        effective = updated.session.audio.input
        assert effective.transcription.language == "en" and effective.turn_detection.type == "server_vad"
        assert effective.turn_detection.silence_duration_ms == 400  # the SLO class's own, reported as used
        await play(conn, talk)
        events = await collect(conn, heard("budget", "house"))

    completed = of(events, COMPLETED)
    assert len(completed) >= 2, [e.type for e in events]
    said = words(" ".join(e.transcript for e in completed))
    assert {"morning", "school", "budget", "house", "big"} <= set(said), said
    total_ms = len(talk) / 48
    previous = None
    for c in completed:
        kinds = [e.type for e in events if getattr(e, "item_id", None) == c.item_id]
        assert kinds[0] == "input_audio_buffer.speech_started" and kinds[-1] == COMPLETED, kinds
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
        started = next(e for e in of(events, "input_audio_buffer.speech_started") if e.item_id == c.item_id)
        stopped = next(e for e in of(events, "input_audio_buffer.speech_stopped") if e.item_id == c.item_id)
        assert 0 <= started.audio_start_ms < stopped.audio_end_ms <= total_ms + 50
        committed = next(e for e in of(events, "input_audio_buffer.committed") if e.item_id == c.item_id)
        assert committed.previous_item_id == previous
        previous = c.item_id
        deltas = "".join(e.delta for e in events if e.type.endswith("transcription.delta")
                         and e.item_id == c.item_id)
        # append-only: the deltas are the transcript, unless the final decode changed words already sent
        assert deltas == c.transcript or not c.transcript.startswith(deltas), (deltas, c.transcript)
        assert c.usage.type == "duration" and 0 < c.usage.seconds < 10
        assert c.model_extra["linguafusion"]["stream_id"].startswith("st_")
    second = next(e for e in completed if "house" in e.transcript.lower())
    second_start = next(e for e in of(events, "input_audio_buffer.speech_started") if e.item_id == second.item_id)
    assert second_start.audio_start_ms > 2500  # on the session's clock: after the first sentence


async def test_it_runs_on_the_stream_engine(api: Api, talk: bytes) -> None:
    """The session's streams are the StreamService's: admitted, their captions timed on /metrics."""
    def counter(text: str, name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    scrape = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    before = httpx.get(api.url + "/metrics", headers=scrape, timeout=10).text
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session=transcription({"type": "server_vad"}, slo="interactive"))
        await play(conn, talk)
        await conn.input_audio_buffer.commit()
        await collect(conn, heard("house"))
    after = httpx.get(api.url + "/metrics", headers=scrape, timeout=10).text
    admitted = "linguafusion_streams_admitted_total"
    assert counter(after, admitted) > counter(before, admitted)
    name = "linguafusion_caption_latency_seconds_count"
    assert counter(after, name) >= counter(before, name) + 2
    assert re.search(r'linguafusion_caption_latency_seconds_count{slo="interactive"} [1-9]', after)


# ---- manual commits, translations, G.711, the beta dialect --------------------------------------------------
async def test_without_turn_detection_a_commit_is_one_item(api: Api, talk: bytes) -> None:
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session=transcription(None))
        await play(conn, talk)
        await conn.input_audio_buffer.commit()
        events = await collect(conn, lambda evs: bool(of(evs, COMPLETED)))
    assert not of(events, "input_audio_buffer.speech_started")  # no VAD events without turn detection
    (committed,), (completed,) = of(events, "input_audio_buffer.committed"), of(events, COMPLETED)
    assert committed.item_id == completed.item_id
    assert {"budget", "house"} <= set(words(completed.transcript)), completed.transcript
    deltas = [e.delta for e in events if e.type.endswith("transcription.delta")]
    assert "".join(deltas) == completed.transcript
    assert 4.0 < completed.usage.seconds < 12.0


async def test_translations_come_as_extension_events(api: Api, talk: bytes) -> None:
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session=transcription({"type": "server_vad"}, target_languages=["es"]))
        await play(conn, talk)

        def done(evs: list[Any]) -> bool:
            return "casa" in " ".join(e.model_extra.get("translation", "") for e in of(
                evs, "conversation.item.input_audio_translation.completed")).lower()
        events = await collect(conn, done)
    translated = of(events, "conversation.item.input_audio_translation.completed")
    assert all(e.model_extra["language"] == "es" for e in translated)
    assert "buenos días" in " ".join(e.model_extra["translation"] for e in translated).lower()
    items = {e.item_id for e in of(events, COMPLETED)}
    assert {e.item_id for e in translated} <= items  # each translation belongs to a transcribed item


async def test_g711_ulaw_audio_is_transcribed(api: Api) -> None:
    import audioop  # deprecated (3.13 drops it), fine for making test data

    speech = pcm(piper_wav(SECOND), 8000) + silence(1.0, 8000)
    ulaw = audioop.lin2ulaw(speech, 2)
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcmu"}, "transcription": {"model": "whisper-1", "language": "en"}}}})
        await play(conn, ulaw, bytes_per_s=8000)
        await conn.input_audio_buffer.commit()
        events = await collect(conn, heard("house"))
    assert "big" in words(" ".join(e.transcript for e in of(events, COMPLETED)))


async def test_the_beta_client_gets_transcription_session_events(api: Api, talk: bytes) -> None:
    # the beta client always dials wss:// unless told the socket's address (a plain-HTTP server here)
    client = openai.AsyncOpenAI(base_url=api.url + "/v1", api_key=api.key, max_retries=0,
                                websocket_base_url=api.url.replace("http://", "ws://") + "/v1")
    async with client.beta.realtime.connect(model="gpt-4o-transcribe") as conn:  # OpenAI-Beta: realtime=v1
        created = await conn.recv()
        assert created.type == "transcription_session.created", created
        await conn.transcription_session.update(session={
            "input_audio_format": "pcm16", "turn_detection": {"type": "server_vad"},
            "input_audio_transcription": {"model": "whisper-1", "language": "en"}})
        updated = await conn.recv()
        assert updated.type == "transcription_session.updated"
        assert updated.session.input_audio_transcription.language == "en"
        await play(conn, talk)
        events = await collect(conn, heard("house"))
    assert {"budget", "house"} <= set(words(" ".join(e.transcript for e in of(events, COMPLETED))))


# ---- what a client can get wrong ----------------------------------------------------------------------------
async def test_bad_client_events_get_error_events_and_the_session_goes_on(api: Api) -> None:
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.recv()  # session.created
        await conn.send({"type": "response.create", "event_id": "evt_1"})
        err = await conn.recv()
        assert err.type == "error" and err.error.param == "type" and err.error.event_id == "evt_1"
        await conn.input_audio_buffer.commit()
        err = await conn.recv()
        assert err.type == "error" and err.error.code == "input_audio_buffer_commit_empty"
        await conn.session.update(session=transcription(language="en") | {
            "audio": {"input": {"transcription": {"model": "whisper-9000"}}}})
        err = await conn.recv()
        assert err.type == "error" and err.error.code == "model_not_found" and err.error.param == "model"
        await conn.session.update(session={"type": "realtime"})
        err = await conn.recv()
        assert err.type == "error" and "transcription sessions only" in err.error.message
        await conn.session.update(session=transcription(None, language="es", target_languages=["ja"]))
        err = await conn.recv()
        assert err.type == "error" and err.error.code == "unsupported_pair"
        await conn.input_audio_buffer.append(audio="not base64!")
        err = await conn.recv()
        assert err.type == "error" and err.error.param == "audio"
        await conn.session.update(session=transcription(None, language="es"))
        ok = await conn.recv()
        assert ok.type == "session.updated" and ok.session.audio.input.transcription.language == "es"


async def test_hostile_session_updates_are_refused_and_the_server_stays_responsive(api: Api) -> None:
    """Wrong JSON types in session.update ended the session with ``internal`` (1011, a traceback in the log), and a
    G.711 format at 8001 Hz was accepted: its first 2,000-byte append held the event loop for hours."""
    bad = [{"audio": {"input": {"format": {"type": ["audio/pcm"]}}}},
           {"input_audio_format": ["pcm16"]},
           {"audio": {"input": {"transcription": {"model": ["whisper-1"]}}}},
           {"linguafusion": {"slo": ["batch"]}},
           {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 8001}}}},
           {"audio": {"input": {"format": {"type": "audio/pcma", "rate": "abc"}}}}]
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.recv()  # session.created
        for session in bad:
            await conn.send({"type": "session.update", "session": session})
            err = await asyncio.wait_for(conn.recv(), 30)
            assert err.type == "error" and err.error.code == "invalid_parameter", (session, err)
        await conn.input_audio_buffer.append(audio=base64.b64encode(b"\x01" * 2000).decode())
        async with httpx.AsyncClient() as http:  # the append did not hold the loop: the server still answers
            assert (await http.get(api.url + "/healthz", timeout=30)).status_code == 200
        await conn.send({"type": "session.update", "session": {"linguafusion": {"glossary_id": "gl_not_this_keys"}}})
        err = await asyncio.wait_for(conn.recv(), 30)  # the field is named, as docs/openai.md says
        assert err.type == "error" and err.error.code == "not_found" and err.error.param == "glossary_id", err
        await conn.session.update(session=transcription(None))
        ok = await asyncio.wait_for(conn.recv(), 30)
        assert ok.type == "session.updated" and ok.session.audio.input.format.rate == 24000


@pytest.mark.parametrize("event", [
    {"type": "session.update", "session": {"type": "transcription", "instructions": "\ud800"}},
    {"type": "session.update", "session": {"audio": {"input": {"transcription": {"prompt": "say \udfff"}}}}},
    {"type": "session.update", "event_id": "evt_\ud800", "session": {"type": "transcription"}},
    {"type": "input_audio_buffer.commit", "event_id": "\udbff"}], ids=["instructions", "prompt", "event_id",
                                                                        "commit_event_id"])
async def test_a_lone_surrogate_gets_an_invalid_request_error_and_the_session_goes_on(api: Api,
                                                                                  event: dict[str, Any]) -> None:
    """A lone UTF-16 surrogate (``"\\ud800"``: a JSON escape that names no character) parsed into the session and
    failed when the event was echoed: close 1011 ``internal``, a traceback in the log. Now the event is refused as
    not strict JSON and the next one is served."""
    async with api.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.recv()  # session.created
        await conn.send(event)  # type: ignore[arg-type]  # json.dumps escapes the surrogate: "\ud800" on the wire
        err = await asyncio.wait_for(conn.recv(), 30)
        assert err.type == "error", err
        assert err.error.type == "invalid_request_error" and err.error.code == "invalid_parameter", err
        assert "surrogate" in err.error.message and err.error.event_id is None
        await conn.send({"type": "session.update", "event_id": "evt_ok", "session": transcription(None)})
        ok = await asyncio.wait_for(conn.recv(), 30)
        assert ok.type == "session.updated" and ok.session.audio.input.transcription.prompt in ("", None), ok
    log = "\n".join(p.read_text(errors="replace") for p in api.state.glob("server-*.log"))
    assert "Traceback" not in log and "surrogates not allowed" not in log


async def test_a_wrong_key_gets_an_error_and_the_socket_closes(api: Api) -> None:
    t = time.monotonic()
    async with api.client(key="sk_not_a_key").realtime.connect(extra_query={"intent": "transcription"}) as conn:
        err = await conn.recv()
        assert err.type == "error" and err.error.code == "invalid_api_key"
        assert "sk_not_a_key" not in err.error.message
        with pytest.raises(Exception):  # noqa: B017 - the close (4401), in whichever class the client raises
            await conn.recv()
    assert time.monotonic() - t < 30


async def test_an_unknown_model_in_the_url_is_refused(api: Api) -> None:
    async with api.client().realtime.connect(model="gpt-5-nope") as conn:
        err = await conn.recv()
        assert err.type == "error" and err.error.code == "model_not_found"


# ---- pieces, without a server -----------------------------------------------------------------------------------
def test_pcm_24k_becomes_16k_the_same_whatever_the_pieces() -> None:
    t = np.arange(24000) / 24000
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    whole = Converter("audio/pcm", 24000)(tone)
    convert = Converter("audio/pcm", 24000)
    pieces = b"".join(convert(tone[i:i + 777]) for i in range(0, len(tone), 777))  # odd: samples cut in two
    assert pieces == whole and len(whole) == 2 * 16000
    out = np.frombuffer(whole, "<i2").astype(float)[200:-200]
    ref = 8000 * np.sin(2 * np.pi * 440 * (np.arange(16000) / 16000 - 24 / 48000))[200:-200]  # the filter's delay
    assert np.abs(out - ref).max() < 50
    alias = (8000 * np.sin(2 * np.pi * 10000 * t)).astype("<i2").tobytes()  # above 8 kHz: filtered out
    assert np.abs(np.frombuffer(Converter("audio/pcm", 24000)(alias), "<i2")[200:-200]).max() < 400


def test_g711_tables_match_the_standard() -> None:
    import audioop

    ramp = np.linspace(-30000, 30000, 4001).astype("<i2").tobytes()
    ours = ULAW[np.frombuffer(audioop.lin2ulaw(ramp, 2), np.uint8)]
    assert ours.tobytes() == audioop.ulaw2lin(audioop.lin2ulaw(ramp, 2), 2)
    alaw = audioop.lin2alaw(ramp, 2)
    assert Converter("audio/pcma")(alaw)  # 8 kHz -> 16 kHz
    from lingua_fusion.api.openai_realtime_audio import ALAW

    assert ALAW[np.frombuffer(alaw, np.uint8)].tobytes() == audioop.alaw2lin(alaw, 2)


def test_session_settings_from_either_dialect() -> None:
    ga = SessionConfig().updated(transcription(None, language="spanish", target_languages=["en"], slo="batch"))
    assert (ga.language, ga.turn_detection, ga.targets, ga.slo) == ("es", False, ("en",), "batch")
    assert ga.start_message() == {"type": "start", "source_lang": "es", "target_langs": ["en"], "slo": "batch",
                                  "partials": True, "inputs": ["audio"]}
    beta = SessionConfig().updated({"input_audio_format": "g711_alaw", "turn_detection": None,
                                    "input_audio_transcription": {"model": "whisper-tiny.en"}})
    assert (beta.format, beta.rate, beta.turn_detection, beta.language) == ("audio/pcma", 8000, False, "en")
    assert beta.to_wire(BETA)["input_audio_format"] == "g711_alaw"
    assert SessionConfig().to_wire(GA)["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    kept = ga.updated({"type": "transcription"})  # fields left out keep their values
    assert kept.stream_shape() == ga.stream_shape()
    with pytest.raises(NotFound):
        SessionConfig().updated({"audio": {"input": {"transcription": {"model": "nope"}}}})
    with pytest.raises(InvalidParameter):
        SessionConfig().updated({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}})
    with pytest.raises(InvalidParameter):
        SessionConfig().updated({"turn_detection": {"type": "push_to_talk"}})
    for fmt in ({"type": "audio/pcmu", "rate": 8001}, {"type": "audio/pcma", "rate": 1}, {"type": "audio/pcm",
                "rate": True}, {"type": "audio/pcm", "rate": "24000"}, {"type": {"audio/pcm": 1}}):
        with pytest.raises(InvalidParameter):
            SessionConfig().updated({"audio": {"input": {"format": fmt}}})
    assert SessionConfig().updated({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 8000}}}}).rate == 8000


def test_wav_helper_sanity() -> None:
    """The test's own audio: 24 kHz PCM of the right length (PyAV, not the server's resampler)."""
    wav = piper_wav(SECOND)
    with wave.open(io.BytesIO(wav)) as w:
        seconds = w.getnframes() / w.getframerate()
    assert abs(len(pcm(wav, 24000)) / 48000 - seconds) < 0.05


# ---- the documented example (docs/openai.md), as written ---------------------------------------------------------
def documented_example(url: str, key: str) -> Callable[..., Any]:
    """The Realtime example of docs/openai.md (the python block that defines transcribe_live), pointed at ``url``."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "openai.md").read_text()
    block = next(b for b in page.split("```python\n")[1:] if "async def transcribe_live" in b).split("```")[0]
    code = block.replace('"http://127.0.0.1:8000/v1"', repr(url + "/v1")).replace('"sk_..."', repr(key))
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/openai.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["transcribe_live"]  # type: ignore[no-any-return]


async def test_the_documented_example_runs_as_written_on_a_file_pushed_as_fast_as_a_loop_goes(
        api: Api, talk: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    transcribe_live = documented_example(api.url, api.key)
    step = 4800  # 100 ms of 24 kHz PCM16
    audio = talk * 3  # ~240 messages, no sleeps between them: more than the server's burst of 100
    chunks = [audio[i:i + step] for i in range(0, len(audio), step)]
    started = time.monotonic()
    transcript = await asyncio.wait_for(transcribe_live(chunks), TIMEOUT_S)
    assert {"morning", "budget", "house"} <= set(words(transcript))  # the whole file, not closed at once
    out = capsys.readouterr().out
    assert "[es]" in out and "casa" in out.lower()  # it printed the translation and then ended by itself
    assert "error:" not in out
    assert time.monotonic() - started < TIMEOUT_S
