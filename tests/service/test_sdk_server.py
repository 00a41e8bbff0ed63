"""The SDK against a real uvicorn server (and in-process), as a user would call it."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import httpx
import pytest
from conftest import Server, piper_wav, render_slide

from lingua_fusion import AsyncMultimodalTranslator, MultimodalTranslator, TranslationResult
from lingua_fusion.errors import AuthenticationError, EmptyInput, UnknownLanguage, UnsupportedPair


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("media") / "talk.wav"
    p.write_bytes(piper_wav("The bank is near the river. The meeting starts at ten."))
    return p


def test_readme_example_against_server(server: Server, talk: Path) -> None:
    with MultimodalTranslator(api_key=server.key(), base_url=server.url) as translator:
        gid = translator.upload_glossary({"bank": "orilla"})
        assert gid.startswith("gl_")
        result = translator.translate(input_media=str(talk), source_modality="audio", target_modality="text",
                                      target_lang="es", enable_glossary=True)
    assert isinstance(result, TranslationResult)
    assert "orilla" in result.text.lower() and "río" in result.text.lower()
    assert "bank" in result.source_text.lower()
    assert result.glossary_terms_applied == [{"source": "bank", "target": "orilla"}]
    assert result.source_lang == "en" and result.target_lang == "es"
    assert result.segments and result.segments[0].start >= 0.0
    assert result.models["asr"].startswith("whisper") and result.models["mt"] == "apertium"
    assert result.latency_ms["total"] > 0


def test_same_language_returns_transcript(server: Server, talk: Path) -> None:
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    r = t.translate(input_media=str(talk), source_modality="audio", target_modality="text", target_lang="en")
    assert r.text == r.source_text and "river" in r.text.lower()


def test_glossary_belongs_to_its_key(server: Server) -> None:
    a = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    gid = a.upload_glossary({"bank": "orilla"})
    b = httpx.get(f"{server.url}/v1/glossaries/{gid}", headers={"Authorization": f"Bearer {server.key()}"})
    assert b.status_code == 404 and b.json()["error"]["code"] == "not_found"


def test_typed_errors_carry_server_codes(server: Server, talk: Path) -> None:
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    with pytest.raises(UnsupportedPair) as exc:
        t.translate(text="hello", source_lang="en", target_lang="ja")
    assert exc.value.code == "unsupported_pair" and "en-es" in exc.value.details["served_pairs"]
    with pytest.raises(UnknownLanguage):
        t.translate(text="hello", target_lang="klingon")
    with pytest.raises(AuthenticationError):
        MultimodalTranslator(api_key="sk_wrong", base_url=server.url).translate(text="hi", target_lang="es")
    local = MultimodalTranslator.local()
    with pytest.raises(UnsupportedPair):
        local.translate(text="hello", source_lang="en", target_lang="ja")
    with pytest.raises(EmptyInput):
        local.translate(text="   ", source_lang="en", target_lang="es")


def test_speech_output_is_wav(server: Server) -> None:
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    r = t.translate(text="The house is very big.", source_lang="en", target_lang="es", target_modality="speech")
    assert r.audio is not None and r.audio_format == "wav"
    with wave.open(io.BytesIO(r.audio)) as w:
        assert w.getnframes() / w.getframerate() > 0.5
    raw = httpx.post(f"{server.url}/v1/translate", headers={"Authorization": f"Bearer {server.key()}"},
                     data={"text": "Hello.", "source_lang": "en", "target_lang": "es", "target_modality": "speech",
                           "output_format": "wav"}, timeout=60)
    assert raw.status_code == 200 and raw.headers["content-type"] == "audio/wav" and raw.content[:4] == b"RIFF"


def _in_two_data_chunks(wav: bytes, share: float) -> bytes:
    """``wav`` (one data chunk at byte 36, as to_wav writes) with its samples split over two ``data`` chunks, the
    first holding ``share`` of them: legal RIFF, as recorders that split their data write."""
    assert wav[36:40] == b"data"
    samples = wav[44:]
    cut = int(len(samples) * share) // 2 * 2
    body = wav[8:36] + b"".join(b"data" + len(p).to_bytes(4, "little") + p for p in (samples[:cut], samples[cut:]))
    return b"RIFF" + len(body).to_bytes(4, "little") + body


def test_a_wav_in_several_data_chunks_is_read_whole_and_a_cut_one_still_refused(server: Server, talk: Path) -> None:
    """An attack on a live server found a WAV whose audio is split over two data chunks refused as truncated
    (FFmpeg plays only the last chunk, shorter than the first one's declared length); now both are read, in order."""
    h = {"Authorization": f"Bearer {server.key()}"}
    split = _in_two_data_chunks(talk.read_bytes(), 0.7)
    r = httpx.post(f"{server.url}/v1/translate", headers=h, timeout=120, files={"file": ("talk.wav", split)},
                   data={"source_modality": "audio", "source_lang": "en", "target_lang": "en"})
    assert r.status_code == 200, r.text
    assert "bank" in r.json()["text"].lower() and "starts" in r.json()["text"].lower()  # each chunk's words
    cut = split[: len(split) - len(talk.read_bytes()) // 4]  # its second chunk loses most of its samples
    r = httpx.post(f"{server.url}/v1/translate", headers=h, timeout=120, files={"file": ("talk.wav", cut)},
                   data={"source_modality": "audio", "source_lang": "en", "target_lang": "en"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "corrupt_media", r.text
    assert "truncated" in r.json()["error"]["message"]


def test_braille_and_captions_over_http(server: Server, talk: Path) -> None:
    h = {"Authorization": f"Bearer {server.key()}"}
    r = httpx.post(f"{server.url}/v1/translate", headers=h, timeout=60,
                   data={"text": "Good morning.", "source_lang": "en", "target_lang": "es",
                         "target_modality": "braille", "output_format": "text"})
    assert r.status_code == 200 and all(0x2800 <= ord(c) <= 0x28FF or c.isspace() for c in r.text.strip())
    srt = httpx.post(f"{server.url}/v1/translate", headers=h, timeout=120,
                     files={"file": ("talk.wav", talk.read_bytes())},
                     data={"source_modality": "audio", "target_lang": "es", "output_format": "srt"})
    assert srt.status_code == 200 and srt.text.startswith("1\n00:00:0") and " --> " in srt.text
    vtt = httpx.post(f"{server.url}/v1/translate", headers=h, timeout=120,
                     files={"file": ("slide.png", render_slide(["The house is very big"]))},
                     data={"source_modality": "image", "target_lang": "es", "output_format": "vtt"})
    assert vtt.status_code == 200 and vtt.text.startswith("WEBVTT") and "casa" in vtt.text.lower()


async def test_async_client(server: Server) -> None:
    async with AsyncMultimodalTranslator(api_key=server.key(), base_url=server.url) as t:
        r = await t.translate(text="The house is very big.", source_lang="en", target_lang="es")
        models = await t.models()
    assert "casa" in r.text.lower()
    assert any(m["task"] == "asr" for m in models["models"]) and "en-es" in models["pairs"]


def test_models_health_and_metrics(server: Server) -> None:
    m = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    gemma = [x for x in m["models"] if x["name"].startswith("gemma")]
    assert gemma and gemma[0]["low_confidence"]
    assert httpx.get(f"{server.url}/healthz", timeout=10).json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/readyz", timeout=10).json()["ready"] is True
    metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.admin_key}"},
                        timeout=10).text  # with auth on, /metrics takes an admin key (or the scrape token)
    assert 'linguafusion_stage_latency_seconds_bucket{le="0.5",stage="mt"}' in metrics
    assert "linguafusion_requests_total" in metrics and "linguafusion_errors_total" in metrics


def test_local_mode_matches_server(server: Server, talk: Path) -> None:
    local = MultimodalTranslator.local()
    r = local.translate(input_media=str(talk), source_modality="audio", target_modality="text", target_lang="es")
    remote = MultimodalTranslator(api_key=server.key(), base_url=server.url).translate(
        input_media=str(talk), source_modality="audio", target_modality="text", target_lang="es")
    assert r.text == remote.text and r.source_text == remote.source_text
