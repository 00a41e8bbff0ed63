"""Language per utterance on a real server over a real WebSocket: one stream started with ``source_lang: "auto"``
hears a speaker switch between English (Piper joe), Spanish and German (espeak-ng), a pause between utterances;
each final says the language it heard, its transcript comes from that language's Whisper, and its caption is in
the target language (the identifier on the translations: py3langid, lingua_fusion/langs.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from conftest import BIN, Server, espeak_wav, piper_wav

from lingua_fusion import MultimodalTranslator, langs
from lingua_fusion.config import LimitSettings
from lingua_fusion.media import decode_audio

PAUSE_S = 1.2  # well over the standard class's end-of-utterance silence (0.4 s): one final per utterance
# sentences Whisper base's language identification tells apart on these voices (bench/language_switch.py measures
# it over 144 clips and 12 voices, where it is weaker: docs/benchmarks.md); what this test pins is the routing
SPOKEN = [("en", "Good morning everyone and welcome to the meeting."),
          ("es", "El tren al aeropuerto sale cada hora."),
          ("de", "Das Wetter wird morgen kalt und regnerisch."),
          ("en", "Please send me the report before Friday."),
          ("es", "Necesitamos más tiempo para terminar el proyecto."),
          ("de", "Wir brauchen mehr Zeit, um das Projekt abzuschließen.")]


def speech(lang: str, text: str) -> np.ndarray:
    wav = piper_wav(text) if lang == "en" else espeak_wav(text, lang)
    audio, _ = decode_audio(wav, LimitSettings())
    return audio


def talk(spoken: list[tuple[str, str]] = SPOKEN) -> tuple[bytes, list[tuple[float, float, str]]]:
    """The utterances with pauses as PCM16 at 16 kHz, and each one's span on the stream's clock and language."""
    silence = np.zeros(int(PAUSE_S * 16000), np.float32)
    parts, spans, t = [silence], [], PAUSE_S
    for lang, text in spoken:
        audio = speech(lang, text)
        parts += [audio, silence]
        spans.append((t, t + len(audio) / 16000, lang))
        t += len(audio) / 16000 + PAUSE_S
    return (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes(), spans


def said(final: dict[str, Any], spans: list[tuple[float, float, str]]) -> int:
    """The utterance a final covers (most overlap)."""
    return max(range(len(spans)), key=lambda i: min(final["end"], spans[i][1]) - max(final["start"], spans[i][0]))


async def test_a_speaker_switching_languages_gets_each_utterance_detected_and_routed(server: Server) -> None:
    pcm, spans = talk()
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    async with t.stream(["en"], source_lang="auto", partials=False, inputs=["audio"]) as s:
        assert s.ready["source_lang"] == "auto" and {"en", "es", "de"} <= set(s.ready["source_langs"])
        for i in range(0, len(pcm), 32000):  # 1 s messages, as a live client sends them
            await s.send_audio(pcm[i:i + 32000])
        await s.end()
        finals = [ev.model_dump() async for ev in s if ev.type == "final"]
    heard = [said(f, spans) for f in finals]
    assert sorted(set(heard)) == list(range(len(SPOKEN))), [(f["start"], f["source_text"]) for f in finals]
    # every final in the language its utterance was spoken in: a user can rely on each one (no tolerance)
    assert [f["source_lang"] for f in finals] == [spans[i][2] for i in heard], [
        (f["source_lang"], f.get("source_lang_confidence"), f["source_text"]) for f in finals]
    for f in finals:
        assert 0.5 <= f["source_lang_confidence"] <= 1.0 and "source_lang_unsure" not in f
        assert f["source_text"].strip() and f["latency_ms"]["detect"] > 0
        if f["source_lang"] == "en":  # the target is the language heard: the transcript itself
            assert f["text"] == f["source_text"]
        else:  # Spanish through Apertium, German through the tiny LLM (marked low-confidence)
            assert f["text"] and f["text"] != f["source_text"]
            assert langs.identify_among(f["text"], ["en", "es", "de"]) == "en", f["text"]
            assert ("en" in (f.get("low_confidence") or [])) == (f["source_lang"] == "de")


async def test_a_stream_that_gives_its_language_is_not_detected(server: Server) -> None:
    audio = speech("es", "El tren al aeropuerto sale cada hora.")
    pcm = (np.r_[audio, np.zeros(16000, np.float32)] * 32767).astype("<i2").tobytes()
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    async with t.stream(["en"], source_lang="es", partials=False, inputs=["audio"]) as s:
        assert s.ready["source_lang"] == "es" and "source_langs" not in s.ready
        await s.send_audio(pcm)
        await s.end()
        finals = [ev.model_dump() async for ev in s if ev.type == "final"]
    assert finals and all(f["source_lang"] == "es" and f.get("source_lang_confidence") is None
                          and "detect" not in f["latency_ms"] for f in finals)
    assert any(f["text"] and f["text"] != f["source_text"] for f in finals)  # translated from Spanish


def test_the_cli_streams_a_file_whose_speaker_switches_with_from_auto(server: Server, tmp_path: Path) -> None:
    from lingua_fusion.models.tts import to_wav

    pcm, spans = talk(SPOKEN[:2])  # English, then Spanish
    wav = tmp_path / "panel.wav"
    wav.write_bytes(to_wav(np.frombuffer(pcm, dtype="<i2"), 16000))
    p = subprocess.run([str(BIN), "stream", str(wav), "--to", "en", "--from", "auto", "--no-partials", "--json",
                        "--url", server.url, "--api-key", server.key()], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    finals = [e for e in map(json.loads, p.stdout.splitlines()) if e["type"] == "final"]
    assert [f["source_lang"] for f in finals] == [spans[said(f, spans)][2] for f in finals] and len(finals) >= 2
    assert "detected source language" not in p.stderr  # the server detects per utterance, not the CLI once
