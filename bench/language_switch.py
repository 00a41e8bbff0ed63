"""Issue 32: language per utterance on a live stream (``source_lang: "auto"``): how often each utterance's language
is detected right, and what the detection costs a caption.

    .venv/bin/python bench/language_switch.py --json bench/results/language_switch.json

Speech: the 12 built-in sentences (lab/fixtures.py) in English and Spanish and in our own German translation, and 4
short phrases per language ("Yes, thank you.", "Next slide, please.", ...), spoken by Piper joe (English) and
espeak-ng voices (en-us, en-gb; es, es-419; de; each also with the +f3 variant): 48 clips per language, 144 in all.

1. Detection, clip by clip (the executor's runner, ``ModelKey.detect()``, the multilingual Whisper base): accuracy
   and the confusions, over the candidates a stream with target ``en`` gets by default (every language of
   stream/languages.py DETECTABLE with a route to en on this server) and over ``source_langs: [en, es, de]``; on
   the trimmed window the server uses and on faster-whisper's 30 s window; the probability of right and wrong
   answers; the time of one detection.
2. The decision (stream/languages.py ``decide``: below SURE the stream keeps its previous language) replayed on
   the clips' scores in two orders: every utterance switching (en, es, de, en, ...: the worst case for keeping the
   previous language) and runs of 4 in one language; accuracy per threshold.
3. Live: one in-process stream (the StreamService, the path after the socket) with ``source_lang: "auto"`` and
   target en, fed in real time 18 utterances (6 per language, voices and sentences rotating) with 1.2 s pauses;
   each final's source_lang against the utterance it covers, and caption latency; then the same utterances on
   three streams whose language is given (one per language, the same pauses): the latency cost of detecting.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SR = 16000
PAUSE_S = 1.2
GERMAN = ["Guten Morgen zusammen und willkommen zur Besprechung.", "Das neue Büro wird im Frühling eröffnet.",
          "Bitte schicken Sie mir den Bericht vor Freitag.", "Wir brauchen mehr Zeit, um das Projekt abzuschließen.",
          "Der Zug zum Flughafen fährt jede Stunde.", "Unser Team ist dieses Jahr stark gewachsen.",
          "Das Haus am Fluss ist sehr alt.", "Ich hätte gern eine Tasse Kaffee mit Milch.",
          "Das Wetter wird morgen kalt und regnerisch.", "Vielen Dank an alle für die harte Arbeit.",
          "Die Kinder spielen im Garten.", "Diese Stadt hat eine schöne alte Kathedrale."]
SHORT = {"en": ["Yes, thank you.", "Next slide, please.", "Any questions?", "Exactly."],
         "es": ["Sí, gracias.", "Siguiente diapositiva, por favor.", "¿Alguna pregunta?", "Exactamente."],
         "de": ["Ja, danke.", "Nächste Folie, bitte.", "Gibt es Fragen?", "Genau."]}
VOICES = {"en": ["piper", "en-us", "en-gb", "en-us+f3"], "es": ["es", "es-419", "es+f3", "es-419+f3"],
          "de": ["de", "de+f3", "de+m3", "de+klatt"]}
THRESHOLDS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass
class Clip:
    lang: str
    voice: str
    text: str
    audio: np.ndarray  # 16 kHz float32

    @property
    def short(self) -> bool:
        return self.text in SHORT[self.lang]


def sentences() -> dict[str, list[str]]:
    from lingua_fusion.lab.fixtures import builtin_sentences

    rows = builtin_sentences()
    return {"en": [en for _i, en, _es in rows], "es": [es for _i, _en, es in rows], "de": GERMAN}


def speak(text: str, voice: str) -> np.ndarray:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media import decode_audio

    if voice == "piper":
        from lingua_fusion.models.tts import to_wav

        pcm, rate = piper().synthesize(text, language="en")
        wav = to_wav(pcm, rate)
    else:
        wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True,
                             timeout=60).stdout
    audio, _info = decode_audio(wav, LimitSettings())
    return audio.astype(np.float32)


@functools.cache
def piper() -> Any:
    from lingua_fusion.models.tts import PiperTTS

    return PiperTTS(varied=False)  # the same speech every run


def clips() -> list[Clip]:
    """Every sentence and short phrase, each language's voices taking turns (48 clips a language)."""
    out = []
    for lang, texts in sentences().items():
        for i, text in enumerate(texts + SHORT[lang]):
            for k in range(3):  # three voices per text, rotating over the language's four
                voice = VOICES[lang][(i + k) % len(VOICES[lang])]
                out.append(Clip(lang, voice, text, speak(text, voice)))
    return out


def detect_all(registry: Any, items: list[Clip], candidates: tuple[str, ...], window_s: float | None
               ) -> tuple[list[dict[str, float]], float]:
    """Each clip's scores through the runner the executor uses (one clip a call), and the mean seconds a call."""
    from lingua_fusion.serving.keys import ModelKey
    from lingua_fusion.serving.ports import DetectInput
    from lingua_fusion.serving.threads import build_runner

    if window_s is None:
        run = build_runner(ModelKey.detect(), registry)
        call = lambda c: run([DetectInput(c.audio, candidates)])[0]  # noqa: E731
    else:
        asr = registry.asr(None)
        call = lambda c: asr.detect_batch([c.audio], candidates, window_s=window_s)[0]  # noqa: E731
    call(items[0])  # warm
    t0 = time.perf_counter()
    scores = [call(c) for c in items]
    return scores, (time.perf_counter() - t0) / len(items)


def accuracy(items: list[Clip], scores: list[dict[str, float]]) -> dict[str, Any]:
    best = [max(s, key=lambda k: s[k]) for s in scores]
    right = [b == c.lang for b, c in zip(best, items, strict=True)]
    confusions: dict[str, int] = {}
    for b, c in zip(best, items, strict=True):
        if b != c.lang:
            confusions[f"{c.lang}->{b}"] = confusions.get(f"{c.lang}->{b}", 0) + 1
    top = [s[b] for s, b in zip(scores, best, strict=True)]
    return {"clips": len(items), "right": sum(right), "accuracy": round(sum(right) / len(items), 4),
            "by_language": {lang: f"{sum(r for r, c in zip(right, items, strict=True) if c.lang == lang)}/"
                                  f"{sum(1 for c in items if c.lang == lang)}" for lang in sentences()},
            "by_voice": {v: f"{sum(r for r, c in zip(right, items, strict=True) if c.voice == v)}/"
                            f"{sum(1 for c in items if c.voice == v)}" for vs in VOICES.values() for v in vs},
            "sentences_right": f"{sum(r for r, c in zip(right, items, strict=True) if not c.short)}/"
                               f"{sum(1 for c in items if not c.short)}",
            "short_right": f"{sum(r for r, c in zip(right, items, strict=True) if c.short)}/"
                           f"{sum(1 for c in items if c.short)}",
            "confusions": dict(sorted(confusions.items(), key=lambda kv: -kv[1])),
            "p_right_min": round(min((p for p, r in zip(top, right, strict=True) if r), default=0.0), 3),
            "p_right_median": round(float(np.median([p for p, r in zip(top, right, strict=True) if r] or [0])), 3),
            "p_wrong": sorted(round(p, 3) for p, r in zip(top, right, strict=True) if not r)}


def orders(items: list[Clip]) -> dict[str, list[int]]:
    """Clip indices in two speaking orders: every utterance switching language, and runs of 4 per language."""
    by = {lang: [i for i, c in enumerate(items) if c.lang == lang] for lang in sentences()}
    n = min(len(v) for v in by.values())
    switching = [by[lang][k] for k in range(n) for lang in by]
    runs = [by[lang][k + j] for k in range(0, n - 3, 4) for lang in by for j in range(4)]
    return {"every utterance switches": switching, "runs of 4": runs}


def replay(items: list[Clip], scores: list[dict[str, float]], order: list[int], sure: float) -> dict[str, Any]:
    from lingua_fusion.stream.languages import decide

    previous, right, unsure = None, 0, 0
    for i in order:
        d = decide(scores[i], previous, "en", sure)
        right += d.lang == items[i].lang
        unsure += d.unsure
        if not d.unsure:
            previous = d.lang
    return {"sure": sure, "accuracy": round(right / len(order), 4), "unsure": unsure}


# ---- 3. live streams -----------------------------------------------------------------------------------------
def live_set(items: list[Clip], n_per_lang: int = 6) -> list[Clip]:
    """18 sentences (no short phrases), the languages taking turns, each language's voices and sentences rotating."""
    by = {lang: [c for c in items if c.lang == lang and not c.short] for lang in sentences()}
    picked = {lang: [v[(k * 7) % len(v)] for k in range(n_per_lang)] for lang, v in by.items()}
    return [picked[lang][k] for k in range(n_per_lang) for lang in picked]


def pcm_of(seq: list[Clip]) -> tuple[bytes, list[tuple[float, float, Clip]]]:
    """The utterances with PAUSE_S between them (and before the first) as PCM16, and each one's span (s)."""
    parts, spans, t = [np.zeros(int(PAUSE_S * SR), np.float32)], [], PAUSE_S
    for c in seq:
        parts += [c.audio, np.zeros(int(PAUSE_S * SR), np.float32)]
        spans.append((t, t + len(c.audio) / SR, c))
        t += len(c.audio) / SR + PAUSE_S
    pcm = (np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes()
    return pcm, spans


async def stream(translator: Any, pcm: bytes, source: str, chunk_s: float = 0.5) -> list[dict[str, Any]]:
    """``pcm`` through one in-process stream at real time; its finals."""
    step = int(chunk_s * SR) * 2
    async with translator.stream(["en"], source_lang=source, partials=True, inputs=["audio"]) as s:
        async def feed() -> None:
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), step)):
                await asyncio.sleep(max(0.0, t0 + k * chunk_s - time.monotonic()))
                await s.send_audio(pcm[i:i + step], ts=i / 2 / SR)
            await s.end()

        feeder = asyncio.create_task(feed())
        finals = [ev.model_dump() async for ev in s if ev.type == "final"]
        await feeder
    return finals


def covering(final: dict[str, Any], spans: list[tuple[float, float, Clip]]) -> Clip | None:
    """The utterance a final overlaps most (None: it covers none)."""
    def overlap(span: tuple[float, float, Clip]) -> float:
        return min(final["end"], span[1]) - max(final["start"], span[0])
    best = max(spans, key=overlap)
    return best[2] if overlap(best) > 0 else None


def latencies(finals: list[dict[str, Any]], key: str) -> dict[str, float]:
    xs = [f["latency_ms"].get(key, 0.0) for f in finals if f["latency_ms"].get(key) is not None]
    if not xs:
        return {}
    return {"mean": round(float(np.mean(xs))), "p50": round(float(np.percentile(xs, 50))),
            "p95": round(float(np.percentile(xs, 95)))}


async def live(translator: Any, seq: list[Clip]) -> dict[str, Any]:
    pcm, spans = pcm_of(seq)
    await stream(translator, pcm_of(seq[:3])[0], "auto")  # every model loaded (the LLM worker started) first
    auto = await stream(translator, pcm, "auto")
    rows, right = [], 0
    for f in auto:
        clip = covering(f, spans)
        ok = clip is not None and f.get("source_lang") == clip.lang
        right += ok
        rows.append({"said": clip.lang if clip else None, "voice": clip.voice if clip else None,
                     "source_lang": f.get("source_lang"), "p": f.get("source_lang_confidence"),
                     "unsure": bool(f.get("source_lang_unsure")), "source_text": f["source_text"],
                     "text": f["text"], "caption_ms": f["latency_ms"].get("caption")})
    heard = {id(c) for c in (covering(f, spans) for f in auto) if c is not None}
    given: dict[str, list[dict[str, Any]]] = {}
    for lang in sentences():  # the same utterances of each language, its language given, the same pauses
        mine = [c for c in seq if c.lang == lang]
        lang_pcm, _ = pcm_of(mine)
        given[lang] = await stream(translator, lang_pcm, lang)
    by_lang_auto = {lang: latencies([f for f in auto if f.get("source_lang") == lang], "caption")
                    for lang in sentences()}
    return {"utterances": len(seq), "finals_count": len(auto), "finals_right": right,
            "utterances_captioned": sum(1 for _s, _e, c in spans if id(c) in heard),
            "caption_ms_auto": latencies(auto, "caption"), "detect_ms": latencies(auto, "detect"),
            "caption_ms_given": latencies([f for fs in given.values() for f in fs], "caption"),
            "caption_ms_auto_by_language": by_lang_auto,
            "caption_ms_given_by_language": {lang: latencies(fs, "caption") for lang, fs in given.items()},
            "finals": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "language_switch.json")
    ap.add_argument("--no-live", action="store_true", help="parts 1 and 2 only (no real-time streams)")
    args = ap.parse_args()

    from lingua_fusion.config import Settings
    from lingua_fusion.lab.fixtures import git_commit
    from lingua_fusion.models.base import among
    from lingua_fusion.models.registry import Registry
    from lingua_fusion.sdk.local import LocalTranslator
    from lingua_fusion.stream.languages import SURE
    from lingua_fusion.stream.protocol import parse_start

    settings = Settings()
    settings.state_dir = Path(tempfile.mkdtemp(prefix="language-switch-"))
    registry = Registry(settings)
    default = tuple(parse_start({"type": "start", "source_lang": "auto", "target_langs": ["en"]},
                                registry.mt_route, []).source_langs)
    items = clips()
    print(f"{len(items)} clips; default candidates for target en: {default}", flush=True)
    detection, kept = [], {}
    union = tuple(dict.fromkeys((*default, "en", "es", "de")))
    for window, window_s in (("trimmed (server)", None), ("30 s", 30.0)):
        scored, seconds = detect_all(registry, items, union, window_s)  # one call a clip, renormalised per set
        for name, candidates in (("default (target en)", default), ("source_langs [en, es, de]", ("en", "es", "de"))):
            scores = [among(s, candidates) for s in scored]
            row = {"candidates": name, "languages": list(candidates), "window": window,
                   "ms_per_detection": round(seconds * 1000, 1), **accuracy(items, scores)}
            detection.append(row)
            print(json.dumps(row), flush=True)
            if window_s is None:
                kept[name] = scores
    decisions = []
    for name, scores in kept.items():
        for order_name, order in orders(items).items():
            for sure in THRESHOLDS:
                row = {"candidates": name, "order": order_name, "utterances": len(order),
                       **replay(items, scores, order, sure)}
                decisions.append(row)
            print(json.dumps([r for r in decisions if r["candidates"] == name and r["order"] == order_name]),
                  flush=True)
    report: dict[str, Any] = {
        "schema": "linguafusion.bench.language_switch/1", "machine": platform.platform(), "commit": git_commit(),
        "audio": "12 built-in sentences in en, es and de + 4 short phrases each; Piper joe and espeak-ng voices "
                 f"{VOICES}", "sure": SURE, "default_candidates": list(default),
        "detection": detection, "decisions": decisions}
    if not args.no_live:
        translator = LocalTranslator(settings)
        try:
            report["live"] = asyncio.run(live(translator, live_set(items)))
        finally:
            translator.engine.close()
        print(json.dumps({k: v for k, v in report["live"].items() if k != "finals"}), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
