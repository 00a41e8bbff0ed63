"""File requests under ``serve --workers 2``: their model work crosses to the model process through the worker's
engine (files/engine.py over serving/shard/remote.py), typed on the wire (``TranscribeInput`` -> ``ASRResult`` with
its segments and their timed words, ``OcrInput``, ``MtInput``, TTS), and the results are those of one process."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import render_slide, start_server, stop_server, talk_wav

SENTENCES = ["The new office will open in the spring.", "Please send me the report before Friday."]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state: Path = tmp_path_factory.mktemp("files-workers")
    u, proc = start_server(state, "--workers", "2", "--no-auth")
    yield u
    stop_server(proc)


@pytest.mark.timeout(300)
def test_speech_with_and_without_its_language_is_transcribed_and_translated_in_the_model_process(url: str) -> None:
    talk = talk_wav(SENTENCES)
    for source in ({"source_lang": "en"}, {}):  # the second: Whisper tells the language
        r = httpx.post(url + "/v1/translate", files={"file": ("talk.wav", talk, "audio/wav")},
                       data={"target_lang": "es", **source}, timeout=240)
        assert r.status_code == 200, r.text
        body = r.json()
        assert "oficina" in body["text"].lower() and body["source_lang"] == "en"
        assert len(body["segments"]) >= 2 and body["segments"][-1]["end"] > body["segments"][0]["end"]
    assert body["source_lang_detected"] and body["models"]["asr"].startswith("whisper-base")


@pytest.mark.timeout(300)
def test_a_slide_and_speech_out_cross_too(url: str) -> None:
    png = render_slide(["Quarterly results", "The new office opens in spring"])
    r = httpx.post(url + "/v1/translate", files={"file": ("slide.png", png, "image/png")},
                   data={"target_lang": "es", "source_lang": "en"}, timeout=240)
    assert r.status_code == 200, r.text
    assert "oficina" in r.json()["text"].lower()
    r = httpx.post(url + "/v1/translate", data={"text": "Good morning. The meeting starts at ten.", "source_lang": "en",
                                                "target_lang": "es", "target_modality": "speech"}, timeout=240)
    assert r.status_code == 200, r.text
    wav = base64.b64decode(r.json()["audio_base64"])
    assert wav[:4] == b"RIFF" and len(wav) > 16000


@pytest.mark.timeout(300)
def test_word_times_cross_from_the_model_process(url: str) -> None:
    r = httpx.post(url + "/v1/translate", files={"file": ("talk.wav", talk_wav(SENTENCES), "audio/wav")},
                   data={"target_lang": "es", "source_lang": "en", "word_timestamps": "true"}, timeout=240)
    assert r.status_code == 200, r.text
    segs = r.json()["segments"]
    assert segs and all([w["word"] for w in s["words"]] == s["source_text"].split() for s in segs), segs
    starts = [w["start"] for s in segs for w in s["words"]]
    assert starts == sorted(starts) and starts[-1] > 2.0
