"""Issue 14: OpenAI's audio API, driven by the official ``openai`` package against a real server on loopback
(``OpenAI(base_url=URL + "/v1", api_key=KEY)``): transcriptions in every response format, segments, server-sent
events, translations from non-English speech (to English, and to another language with a glossary), and the
errors a client of OpenAI's API expects (unknown model, wrong key) in OpenAI's error shape."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from conftest import BIN, espeak_wav, free_port, piper_wav, render_slide, start_server, stop_server

pytestmark = pytest.mark.slow
ENGLISH = "Good morning everyone. Today we talk about the school budget."
SPANISH = "Buenos días a todos. La casa es muy grande y tiene un jardín bonito."


@dataclass
class Api:
    url: str
    key: str
    state: Path

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or self.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    state = tmp_path_factory.mktemp("openai-state")
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    url, proc = start_server(state, port=free_port())
    yield Api(url, key, state)
    stop_server(proc)


@pytest.fixture(scope="module")
def english(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("speech") / "english.wav"
    path.write_bytes(piper_wav(ENGLISH))
    return path


@pytest.fixture(scope="module")
def spanish(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("speech") / "spanish.wav"
    path.write_bytes(espeak_wav(SPANISH, "es"))
    return path


def words(text: str) -> set[str]:
    return {w.strip(".,!?").lower() for w in text.split()}


# ---- transcriptions -------------------------------------------------------------------------------------------
def test_transcription_json(api: Api, english: Path) -> None:
    with english.open("rb") as f:
        r = api.client().audio.transcriptions.create(model="whisper-1", file=f, language="en",
                                                     prompt="school budget")
    assert isinstance(r, openai.types.audio.Transcription)
    assert {"morning", "today", "school", "budget"} <= words(r.text), r.text
    assert r.usage is not None and r.usage.type == "duration" and 2.0 < r.usage.seconds < 10.0


def test_transcription_detects_the_language(api: Api, spanish: Path) -> None:
    """No ``language``: Whisper detects it; the transcript stays in Spanish (a transcription is not translated)."""
    with spanish.open("rb") as f:
        text = api.client().audio.transcriptions.create(model="gpt-4o-transcribe", file=f, response_format="text")
    assert isinstance(text, str) and text.endswith("\n")
    assert {"casa", "grande", "jardín"} & words(text), text


def test_transcription_srt_and_vtt(api: Api, english: Path) -> None:
    client = api.client()
    srt = client.audio.transcriptions.create(model="whisper-1", file=english.open("rb"), response_format="srt")
    assert srt.startswith("1\n00:00:00,") and " --> 00:00:0" in srt and "budget" in srt.lower(), srt
    vtt = client.audio.transcriptions.create(model="whisper-1", file=english.open("rb"), response_format="vtt")
    assert vtt.startswith("WEBVTT") and " --> 00:00:0" in vtt and "budget" in vtt.lower(), vtt


def test_transcription_verbose_json_has_segments(api: Api, english: Path) -> None:
    with english.open("rb") as f:
        r = api.client().audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                     timestamp_granularities=["segment"])
    assert isinstance(r, openai.types.audio.TranscriptionVerbose)
    assert r.language == "english" and 2.0 < r.duration < 10.0 and "budget" in r.text.lower()
    assert r.segments and r.segments[0].start == 0.0 and r.segments[-1].end <= r.duration + 0.5
    assert " ".join(s.text for s in r.segments) == r.text
    for i, s in enumerate(r.segments):
        assert s.id == i and s.start < s.end and s.temperature == 0.0 and s.avg_logprob <= 0.0


def test_transcription_streams_server_sent_events(api: Api, english: Path) -> None:
    with english.open("rb") as f:
        events = list(api.client().audio.transcriptions.create(model="gpt-4o-mini-transcribe", file=f,
                                                               stream=True))
    assert [e.type for e in events][-1] == "transcript.text.done"
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas and "".join(deltas) == events[-1].text and "budget" in events[-1].text.lower()


# ---- translations ---------------------------------------------------------------------------------------------
def test_translation_of_spanish_speech_into_english(api: Api, spanish: Path) -> None:
    with spanish.open("rb") as f:
        r = api.client().audio.translations.create(model="whisper-1", file=f)
    assert {"house", "garden"} & words(r.text), r.text
    extra = r.model_extra or {}
    assert extra["linguafusion"]["source_lang"] == "es" and extra["linguafusion"]["target_lang"] == "en"


def test_translation_verbose_json_says_english(api: Api, spanish: Path) -> None:
    with spanish.open("rb") as f:
        r = api.client().audio.translations.create(model="whisper-1", file=f, response_format="verbose_json")
    assert r.language == "english" and r.segments and {"house", "garden"} & words(r.text), r.text


def test_translation_to_another_language_with_a_glossary(api: Api, tmp_path: Path) -> None:
    """Extensions: ``target_language`` and ``glossary_id`` (a glossary uploaded on our own route)."""
    gid = httpx.post(api.url + "/v1/glossaries", headers={"Authorization": f"Bearer {api.key}"},
                     data={"terms": "bank,orilla\n"}, timeout=30).json()["glossary_id"]
    wav = tmp_path / "bank.wav"
    wav.write_bytes(piper_wav("I went to the bank."))
    client = api.client()
    plain = client.audio.translations.create(model="whisper-1", file=wav.open("rb"),
                                             extra_body={"target_language": "es", "language": "en"})
    assert "banco" in plain.text.lower(), plain.text
    termed = client.audio.translations.create(model="whisper-1", file=wav.open("rb"),
                                              extra_body={"target_language": "es", "language": "en",
                                                          "glossary_id": gid})
    assert "la orilla" in termed.text.lower(), termed.text
    assert termed.model_extra["linguafusion"]["glossary_terms_applied"] == [{"source": "bank", "target": "orilla"}]


# ---- errors in OpenAI's shape ---------------------------------------------------------------------------------
def test_unknown_model_is_a_404_in_openais_shape(api: Api, english: Path) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        api.client().audio.transcriptions.create(model="whisper-9000", file=english.open("rb"))
    body = exc.value.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}
    assert body["code"] == "model_not_found" and body["param"] == "model" and "whisper-1" in body["message"]
    with pytest.raises(openai.NotFoundError):
        api.client().audio.translations.create(model="tts-1", file=english.open("rb"))


def test_diarized_json_needs_the_diarizing_model(api: Api, english: Path) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        api.client().audio.transcriptions.create(model="whisper-1", file=english.open("rb"),
                                                 response_format="diarized_json")
    assert "gpt-4o-transcribe-diarize" in exc.value.body["message"] and exc.value.body["param"] == "response_format"


def test_wrong_key_is_a_401(api: Api, english: Path) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        api.client(key="sk_not_a_key").audio.transcriptions.create(model="whisper-1", file=english.open("rb"))
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key" and exc.value.body["type"] == "authentication_error"
    assert "sk_not_a_key" not in str(exc.value.body)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"timestamp_granularities": ["word"], "response_format": "json"}, "timestamp_granularities[]"),
    ({"response_format": "docx"}, "response_format"),
    ({"temperature": 1.5}, "temperature"),
    ({"language": "klingon"}, "language"),
    ({"model": "whisper-tiny.en", "language": "es"}, "language"),
], ids=["word-timestamps", "format", "temperature", "language", "english-only-model"])
def test_bad_fields_are_400s_naming_the_field(api: Api, english: Path, kwargs: dict[str, object],
                                              param: str) -> None:
    args: dict[str, object] = {"model": "whisper-1", **kwargs}
    with pytest.raises(openai.BadRequestError) as exc:
        api.client().audio.transcriptions.create(file=english.open("rb"), **args)  # type: ignore[call-overload]
    assert exc.value.body["param"] == param, exc.value.body


def test_a_picture_is_refused_as_not_speech(api: Api) -> None:
    with pytest.raises(openai.APIStatusError) as exc:
        api.client().audio.transcriptions.create(model="whisper-1", file=("slide.png", render_slide(["Hello"])))
    assert exc.value.status_code == 415 and exc.value.body["param"] == "file", exc.value.body

