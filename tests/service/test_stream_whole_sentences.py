"""A live sentence longer than the longest utterance: a real server, real Piper speech, real Whisper and Apertium.

The commit policy cuts an utterance at ``max_utterance_s`` (10 s for ``standard``) while the speaker goes on;
the caption cut there waits for the next one, and MT translates the two as one sentence (stream/finals.py).
"""

from __future__ import annotations

from typing import Any

import jiwer
from conftest import Server, piper_wav

from lingua_fusion import MultimodalTranslator
from lingua_fusion.config import LimitSettings
from lingua_fusion.media import decode_audio
from lingua_fusion.sentences import join

# about 11.5 s of Piper with no comma (Piper pauses at commas, and a pause would end the utterance there)
LONG = ("When you see your sister and her two children at the main station tomorrow morning before the first "
        "train leaves for the coast please ask her to bring these things with her from the store near the old "
        "market on her way back home tonight after work")


def _norm(s: str) -> str:
    return str(jiwer.RemovePunctuation()(s.lower())).strip()


async def test_a_sentence_longer_than_an_utterance_is_translated_as_one_sentence(server: Server) -> None:
    audio, _ = decode_audio(piper_wav(LONG), LimitSettings())
    assert len(audio) / 16000 > 10.8  # longer than standard's 10 s utterances, whatever Piper's pace
    pcm = (audio.clip(-1, 1) * 32767).astype("<i2").tobytes()
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    finals: list[dict[str, Any]] = []
    async with t.stream(["es"], slo="standard", partials=False) as s:  # a held caption waits 8 s at most
        await s.send_audio(pcm, ts=0.0)
        await s.end()
        finals = [ev.model_dump() async for ev in s if ev.type == "final"]
    sources = [f["source_text"] for f in finals]
    assert len(finals) >= 2, sources  # cut by the length limit: the words of one sentence in two captions ...
    assert jiwer.wer(_norm(LONG), _norm(" ".join(sources))) <= 0.15, sources
    assert finals[0]["sentence"] == [f["seq"] for f in finals[:len(finals[0]["sentence"])]]
    together = finals[:len(finals[0]["sentence"])]
    assert len(together) >= 2 and not any(f.get("note") for f in together)
    # ... and their translation is the whole sentence's, as if it had been sent as text
    as_text = t.translate(text=join([f["source_text"] for f in together], "en"), source_lang="en",
                          target_lang="es").text
    assert " ".join(f["text"] for f in together) == as_text.strip()
    assert all(f["text"] for f in together)  # each caption has its share of the translation
    assert finals[0]["latency_ms"]["held"] > 0
