"""Issue 32, word times: each spoken word with its start and end, through every face of the file path, against a
real server with the real Whisper. The OpenAI route (official ``openai`` client): ``verbose_json`` with
``timestamp_granularities[]=word`` gives one word per word spoken, in order, inside the audio; ``segment`` too gives
both, as OpenAI does; word granularity elsewhere is OpenAI's 400. ``POST /v1/translate`` (``word_timestamps``), the
SDK (server and in-process) and the CLI (``--words``) give ``segments[i].words`` that spell the segment's spoken
text, also for a file long enough to be cut into pieces; bad requests are typed 4xx / ``error [code]`` exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from conftest import BIN, free_port, piper_wav, start_server, stop_server, talk_wav

from lingua_fusion.sdk import MultimodalTranslator
from lingua_fusion.types import TranslationResult

pytestmark = pytest.mark.slow
SPOKEN = "Good morning everyone. Today we talk about the school budget."
# over Whisper's 30 s window: the file is transcribed in pieces cut at its pauses (files/pieces.py)
LONG = ["The first speaker opens the meeting with a short welcome.",
        "Our school needs a new roof before the winter comes.",
        "The library will stay open until eight in the evening.",
        "Parents asked for more buses on the northern routes.",
        "The science teachers want a larger budget for the lab.",
        "We will vote on the proposal at the next meeting.",
        "The sports field is closed for repairs this month.",
        "Thank you all for coming and for your questions.",
        "Please send your comments to the office by Friday.",
        "The next meeting is on the second Monday of March."]


def norm(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def duration(wav: bytes) -> float:
    with wave.open(BytesIO(wav)) as w:
        return w.getnframes() / w.getframerate()


@dataclass
class Api:
    url: str
    key: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    state = tmp_path_factory.mktemp("words-state")
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    url, proc = start_server(state, port=free_port())
    yield Api(url, key)
    stop_server(proc)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("words-media") / "morning.wav"
    path.write_bytes(piper_wav(SPOKEN))
    return path


def assert_spells_its_segments(result: TranslationResult, length_s: float) -> None:
    """Every segment has words that spell its spoken text, in time order, inside the segment and the audio."""
    assert result.segments
    last = 0.0
    for seg in result.segments:
        assert seg.words, seg
        assert [w.word for w in seg.words] == seg.source_text.split(), seg
        for w in seg.words:
            assert seg.start <= w.start <= w.end <= seg.end, (w, seg)
            assert w.start >= last - 1e-6 and 0.0 <= w.probability <= 1.0, w
            last = w.start
    assert result.segments[-1].words[-1].end <= length_s + 0.1  # type: ignore[index]


# ---- the OpenAI route --------------------------------------------------------------------------------------------
def test_openai_verbose_json_gives_one_word_per_spoken_word_in_order(api: Api, speech: Path) -> None:
    with speech.open("rb") as f:
        r = api.client().audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                     timestamp_granularities=["word"])
    assert r.words is not None and r.segments is None  # OpenAI's shape: word alone gives no segments
    assert [norm(w.word) for w in r.words] == [norm(w) for w in SPOKEN.split()], r.words
    length = duration(speech.read_bytes())
    for a, b in zip(r.words, r.words[1:], strict=False):
        assert a.start <= a.end <= b.start + 1e-6, (a, b)
    assert 0.0 <= r.words[0].start and r.words[-1].end <= length + 0.05 and r.words[-1].end > length * 0.7


def test_openai_word_and_segment_granularities_give_both(api: Api, speech: Path) -> None:
    with speech.open("rb") as f:
        r = api.client().audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                     timestamp_granularities=["word", "segment"])
    assert r.segments and r.words
    assert " ".join(w.word for w in r.words) == " ".join(s.text for s in r.segments) == r.text
    assert r.words[0].start >= r.segments[0].start and r.words[-1].end <= r.segments[-1].end


@pytest.mark.parametrize("call", ["json", "translation", "stream"])
def test_openai_word_granularity_outside_a_verbose_transcription_is_a_400(api: Api, speech: Path,
                                                                        call: str) -> None:
    client = api.client()
    with pytest.raises(openai.BadRequestError) as exc:
        if call == "json":
            client.audio.transcriptions.create(model="whisper-1", file=speech.open("rb"), response_format="json",
                                               timestamp_granularities=["word"])
        elif call == "translation":
            client.audio.translations.create(model="whisper-1", file=speech.open("rb"),
                                             response_format="verbose_json",
                                             extra_body={"timestamp_granularities": ["word"]})
        else:
            list(client.audio.transcriptions.create(model="whisper-1", file=speech.open("rb"), stream=True,
                                                    response_format="verbose_json",
                                                    timestamp_granularities=["word"]))
    assert exc.value.body["param"] == "timestamp_granularities[]", exc.value.body
    assert exc.value.body["code"] == "invalid_parameter"


# ---- POST /v1/translate, the SDK, the CLI ------------------------------------------------------------------------
def test_translate_gives_the_spoken_words_beside_the_translation(api: Api, speech: Path) -> None:
    result = MultimodalTranslator(api_key=api.key, base_url=api.url).translate(
        str(speech), target_lang="es", source_lang="en", word_timestamps=True)
    assert "presupuesto" in result.text.lower() or "escuela" in result.text.lower(), result.text
    assert_spells_its_segments(result, duration(speech.read_bytes()))
    plain = MultimodalTranslator(api_key=api.key, base_url=api.url).translate(str(speech), target_lang="es",
                                                                              source_lang="en")
    assert all(s.words is None for s in plain.segments)  # not asked: not timed


def test_a_long_file_cut_in_pieces_keeps_its_words_on_the_files_clock(tmp_path: Path) -> None:
    """In-process (``MultimodalTranslator.local()``): 40 s of speech, transcribed as pieces of at most 30 s."""
    wav = talk_wav(LONG, pause_s=1.2)
    length = duration(wav)
    assert length > 32.0
    path = tmp_path / "meeting.wav"
    path.write_bytes(wav)
    local = MultimodalTranslator.local()
    try:
        result = local.translate(str(path), target_lang="en", source_lang="en", word_timestamps=True)
    finally:
        local.close()
    assert_spells_its_segments(result, length)
    late = [w for s in result.segments for w in s.words or () if w.start > 30.0]
    assert {"march", "monday"} <= {norm(w.word) for w in late}, late


@pytest.mark.parametrize(("fields", "code"), [
    ({"text": "Good morning.", "target_lang": "es", "word_timestamps": "true"}, "invalid_parameter"),
    ({"target_lang": "es", "word_timestamps": "maybe"}, "invalid_parameter"),
], ids=["text-has-no-spoken-words", "not-a-flag"])
def test_bad_word_timestamps_are_typed_400s(api: Api, speech: Path, fields: dict[str, str], code: str) -> None:
    files = None if "text" in fields else {"file": ("morning.wav", speech.read_bytes(), "audio/wav")}
    r = httpx.post(api.url + "/v1/translate", data=fields, files=files, timeout=60,
                   headers={"Authorization": f"Bearer {api.key}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["details"]["field"] == "word_timestamps"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), "translate", *args], capture_output=True, text=True, timeout=280)


def test_cli_words_in_json_and_as_karaoke_captions(api: Api, speech: Path) -> None:
    server = ("--url", api.url, "--api-key", api.key)
    p = cli(str(speech), "--to", "es", "--from", "en", "--json", "--words", *server)
    assert p.returncode == 0, p.stderr
    segs = json.loads(p.stdout)["segments"]
    assert [norm(w["word"]) for s in segs for w in s["words"]] == [norm(w) for w in SPOKEN.split()]
    p = cli(str(speech), "--to", "es", "--from", "en", "--format", "vtt", "--words", *server)
    assert p.returncode == 0, p.stderr
    cue = p.stdout.split("\n\n")[1].splitlines()
    assert cue[1].startswith("Good <00:00:00.") and "morning" in cue[1], cue  # the spoken words, timed
    assert "buenos" in cue[2].lower(), cue  # the translation under them


def test_cli_words_without_an_output_that_shows_them_is_a_usage_error(speech: Path) -> None:
    p = cli(str(speech), "--to", "es", "--words")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("error [invalid_parameter]: --words"), p.stderr
    p = cli("--text", "Good morning.", "--to", "es", "--json", "--words")
    assert p.returncode == 2 and "error [invalid_parameter]: --words times spoken words" in p.stderr, p.stderr


# ---- live streams ------------------------------------------------------------------------------------------------
async def test_a_stream_s_finals_carry_their_spoken_words_on_the_stream_s_clock(api: Api) -> None:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media import decode_audio

    audio, _ = decode_audio(talk_wav(LONG[:3]), LimitSettings())
    data = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    t = MultimodalTranslator(base_url=api.url, api_key=api.key)
    async with t.stream(["es"], partials=False, slo="batch", word_timestamps=True) as s:
        for at in range(0, len(data), 32000):  # 1 s messages
            await s.send_audio(data[at: at + 32000], ts=at / 32000)
        await s.end()
        finals = [e async for e in s if e.type == "final"]
    assert finals and all(f.text for f in finals)
    last = 0.0
    for f in finals:
        words = (f.model_extra or {}).get("words")
        assert words, f
        assert [norm(w["word"]) for w in words] == [norm(x) for x in (f.source_text or "").split()], f
        for w in words:
            assert (f.start or 0) - 0.1 <= w["start"] <= w["end"] <= (f.end or 0) + 0.1, (w, f.start, f.end)
            assert w["start"] >= last - 1e-6
            last = w["start"]
    assert last <= len(audio) / 16000 + 0.1


async def test_a_bad_word_timestamps_on_a_stream_is_a_typed_error(api: Api) -> None:
    from websockets.asyncio.client import connect

    for start in ({"word_timestamps": "yes"}, {"word_timestamps": True, "inputs": ["text"]}):
        async with connect(api.url.replace("http", "ws", 1) + "/v1/streams",
                           additional_headers={"Authorization": f"Bearer {api.key}"}) as ws:
            await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], **start}))
            got = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert got["type"] == "error" and got["code"] == "invalid_parameter", got
            assert got.get("details", {}).get("field") == "word_timestamps", got


def test_cli_stream_words_prints_each_final_s_words_with_their_times(api: Api, speech: Path) -> None:
    p = subprocess.run([str(BIN), "stream", str(speech), "--to", "es", "--words", "--no-partials", "--url", api.url,
                        "--api-key", api.key, "--from", "en"], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    timed = [line.split() for line in p.stdout.splitlines() if "@" in line]
    spoken = [norm(w.rsplit("@", 1)[0]) for line in timed for w in line]
    assert spoken == [norm(w) for w in SPOKEN.split()], p.stdout
