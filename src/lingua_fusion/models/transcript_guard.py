"""What a transcript says about itself (pure): decoder loops, hallucination signs, and Mandarin's script.

Applied where a transcript leaves ASR, whatever the backend (CTranslate2 or torch): ``guard_segments`` for a file's
segments (files/speech.py), ``guard_text`` for a stream's utterance (serving/threads.py; no script there).

- ``check``: Whisper's own tests of a decoded window, applied to every path (files and streams): a compression
  ratio above 2.4 (zlib; the text repeats itself) or a run of the same short piece eight times or more ("天天天...")
  is a loop. The loop is cut to its first occurrence and the segment is marked ``suspect``: its confidence drops
  and the result carries a warning naming it, never a normal transcript.
- ``heard_nothing``: Whisper's own test that a window held no speech (a no-speech probability above 0.6 and a mean
  log-probability under -1.0: what it decoded is a guess at silence, "You", "Oh", "Yeah" over music). faster-whisper's
  ``transcribe`` (files; the per-stream benchmark baseline) skips such a segment itself; the trimmed-window batch
  decode of streams' utterances (``transcribe_batch``, both backends) calls the decoder directly, so it applies the
  test here and answers an empty text: no final, no partial.
- ``to_script``: Whisper writes Mandarin in Traditional characters as often as not, whatever the prompt. ``zh``
  (and zh-CN, zh-Hans) is given Simplified characters, zh-TW / zh-Hant Traditional (Taiwan's forms), with OpenCC's
  tables (opencc-python-reimplemented, Apache-2.0, pure Python); the result says which (``script``). Files convert
  in files/speech.py and files/mt.py, streams in stream/jobs.py (``heard``, ``written``: every ASR backend alike).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .base import ASRSegment
from .word_times import realigned, rewritten

MAX_COMPRESSION = 2.4  # Whisper's compression_ratio_threshold
MIN_CHARS = 40  # shorter texts do not compress enough to tell
RUN = re.compile(r"(.{1,6}?)\1{7,}", re.DOTALL)  # a piece of 1-6 characters repeated 8 times or more
SUSPECT_CONFIDENCE = 0.05
NO_SPEECH_PROB = 0.6  # Whisper's no_speech_threshold
LOGPROB_FLOOR = -1.0  # Whisper's logprob_threshold


@dataclass(frozen=True)
class Checked:
    text: str
    suspect: bool
    why: str = ""


def heard_nothing(no_speech_prob: float, mean_logprob: float) -> bool:
    """Whisper's rule for a window that held no speech (openai/whisper transcribe.py, faster-whisper alike): the
    no-speech token's probability above NO_SPEECH_PROB *and* the decoded text's mean log-probability under
    LOGPROB_FLOOR. Both, because either alone also fires on real speech: a confident word over music has a high
    no-speech probability, a mumbled one a low log-probability."""
    return no_speech_prob > NO_SPEECH_PROB and mean_logprob < LOGPROB_FLOOR


def mean_logprob(score: float, tokens: int) -> float:
    """faster-whisper's ``avg_logprob`` from a CTranslate2 score (the sum of log-probabilities over ``tokens``,
    length-normalised): the sum over the tokens and the end-of-text token."""
    return score * tokens / (tokens + 1) if tokens > 0 else score


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw)))


def check(text: str) -> Checked:
    """``text`` with any decoder loop cut, and whether it looked like one."""
    cut = RUN.sub(lambda m: m.group(1), text)
    if cut != text:
        return Checked(cut.strip(), True, "a repetition loop was cut")
    if len(text) >= MIN_CHARS and compression_ratio(text) > MAX_COMPRESSION:
        return Checked(text, True, f"the text repeats itself (compression ratio {compression_ratio(text):.1f})")
    return Checked(text, False)


SCRIPT_NAMES = {"Hans": "zh-Hans (Simplified)", "Hant": "zh-Hant (Traditional)"}  # what results say of them
SIMPLIFIED = {"zh", "zh-cn", "zh-hans", "zh-sg"}
TRADITIONAL = {"zh-tw", "zh-hant", "zh-hk"}


def script_for(lang: str | None) -> str | None:
    """"Hans" / "Hant" for a Chinese language tag, None for anything else."""
    tag = (lang or "").lower()
    return "Hans" if tag in SIMPLIFIED else "Hant" if tag in TRADITIONAL else None


@lru_cache(maxsize=2)
def _converter(config: str) -> Any:
    from opencc import OpenCC  # opencc-python-reimplemented: pure Python, untyped

    return OpenCC(config)


def to_script(text: str, script: str) -> str:
    # Traditional in Taiwan's standard forms (s2tw: 哪裡, not OpenCC's 哪裏), what most zh-Hant readers expect
    return str(_converter("t2s" if script == "Hans" else "s2tw").convert(text))


def guard_segments(segments: list[ASRSegment], script: str | None) -> tuple[list[ASRSegment], list[str]]:
    """A file's segments with loops cut (a suspect one's confidence at most SUSPECT_CONFIDENCE), empty ones
    dropped, in ``script`` when given; and a warning per suspect segment. Their words follow the text
    (models/word_times.py)."""
    out, warnings = [], []
    for seg in segments:
        checked = check(seg.text)
        if not checked.text:
            continue
        conf = seg.confidence
        if checked.suspect:
            conf = min(conf, SUSPECT_CONFIDENCE)
            warnings.append(f"possible hallucination at {seg.start:.1f}-{seg.end:.1f} s: {checked.why}")
        words = realigned(seg.words, checked.text) if checked.text != seg.text else seg.words
        if script:
            words = rewritten(words, lambda w: to_script(w, script))
        out.append(ASRSegment(seg.start, seg.end, to_script(checked.text, script) if script else checked.text, conf,
                              words))
    return out, warnings


def guard_text(text: str, confidence: float, script: str | None) -> tuple[str, float]:
    """A stream utterance's text and confidence, the same tests applied."""
    checked = check(text)
    conf = min(confidence, SUSPECT_CONFIDENCE) if checked.suspect else confidence
    return (to_script(checked.text, script) if script else checked.text), conf
