"""Which language a live stream's utterance is in, when its start message left that to the server (pure).

A stream started with ``source_lang: "auto"`` has candidate languages (``StreamSpec.source_langs``: the start
message's ``source_langs``, or every language of ``DETECTABLE`` that the server can transcribe and route to each
of the stream's targets). Each committed utterance is scored by Whisper's language identification over them
(``DetectInput``: probabilities summing to 1), and ``decide`` turns the scores into the language the utterance is
transcribed and translated from:

- the best candidate, when its probability is at least ``SURE``;
- else the stream's previous sure language, if it has one: a short or unclear utterance ("OK", a name, a cough that
  passed the VAD) is far more often the speaker going on in their language than a switch, and a wrong switch costs
  a caption transcribed by the wrong model and translated through the wrong route;
- else (nothing sure heard yet) the best candidate.

An unsure decision says so on its final (``source_lang_unsure``, a note naming what was heard).
bench/language_switch.py measures ``SURE`` (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# languages a stream may be detected in when its start message lists none: Whisper base's well-served European
# languages and Mandarin, kept only when every target has a route from it (protocol.py); fewer candidates make a
# short utterance less ambiguous (Whisper's own 99 would call Spanish Galician and German Dutch)
DETECTABLE = ("en", "es", "fr", "de", "pt", "ca", "it", "zh")
MAX_SOURCE_LANGS = 8  # candidates a start message may list
SURE = 0.5  # below this the detection is unsure: the previous language is kept (bench/language_switch.py)


@dataclass(frozen=True)
class Detection:
    """What was decided of one utterance's language."""

    lang: str  # the language its transcript and translations come from
    confidence: float  # the detector's probability for ``lang``, among the stream's candidates (0-1)
    heard: str  # the detector's best candidate (differs from ``lang`` when an unsure one kept the previous)
    heard_confidence: float  # ... and its probability
    unsure: bool = False  # the best candidate scored under SURE

    def note(self, candidates: list[str]) -> str | None:
        """What an unsure final says of its language (None when sure)."""
        if not self.unsure:
            return None
        why = (f"kept {self.lang}, the stream's language so far" if self.lang != self.heard
               else "taken as heard (no language heard surely before)")
        return (f"language unsure: {self.heard} scored {self.heard_confidence:.2f} among {', '.join(candidates)}; "
                f"{why}")


def decide(probs: Mapping[str, float], previous: str | None, fallback: str, sure: float = SURE) -> Detection:
    """The language an utterance that scored ``probs`` (candidate -> probability) is taken in. ``previous``: the
    stream's last sure language (None before one); ``fallback``: the language when nothing was scored at all (the
    detection failed)."""
    if not probs:
        lang = previous or fallback
        return Detection(lang, 0.0, lang, 0.0, unsure=True)
    heard = max(probs, key=lambda c: probs[c])
    top = round(float(probs[heard]), 3)
    if top >= sure:
        return Detection(heard, top, heard, top)
    lang = previous if previous is not None and previous in probs else heard
    return Detection(lang, round(float(probs[lang]), 3), heard, top, unsure=True)
