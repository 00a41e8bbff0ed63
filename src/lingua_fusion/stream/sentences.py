"""Whole sentences for a stream's MT (pure): a caption cut at the maximum length waits for the next one.

The commit policy (stream/policy.py) ends an utterance at a pause or, when the speaker goes on, at
``max_utterance_s``. A length cut usually falls inside a sentence ("... ask her to bring these" | "things with her
from the store."), and MT given either piece alone translates neither right. So a final cut by length is held: its
words are known, its translation waits for the next final (``waits``: at most one more, and at most the class's
``sentence_hold_s``, stream/finals.py). When that one goes on with the sentence (``joins``: the held words have no
final punctuation, or the next ones start in lower case: Whisper's full stop at the cut), the two are translated as
one text and the translation is cut back onto both (``share``: each piece sized like its share of the source,
lingua_fusion/sentences.py ``spread``), and they go out together, in order. Otherwise, or when nothing comes in
time (the speaker stopped, the stream ended, a drain), the held one is translated alone, and says so
(``open_note``) when its sentence was left open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..sentences import continues, ends_sentence, spread
from .events import Final

MAX_GROUP = 2  # a held caption waits for one more at most: its latency stays bounded


@dataclass(frozen=True)
class Heard:
    """What the decision reads of a final: its words, why its utterance ended, whether it is speech, its language
    (a "auto" stream's speaker may switch at a cut: two languages are not one sentence)."""

    text: str
    cut: str = "pause"
    speech: bool = True
    lang: str = ""
    speaker: str = ""  # a ``diarize`` stream's label: two speakers' words are not one sentence

    @classmethod
    def of(cls, final: Final) -> Heard:
        return cls(final.source_text, final.cut, final.modality == "audio", final.source_lang or "",
                   final.speaker or "")


def waits(group: Sequence[Heard], max_group: int = MAX_GROUP) -> bool:
    """Does the group's translation wait for the next final? Its last utterance had words and was cut at the
    length limit while the speaker went on, and the group may still grow."""
    last = group[-1]
    return last.speech and last.cut == "length" and bool(last.text.strip()) and len(group) < max_group


def joins(group: Sequence[Heard], nxt: Heard) -> bool:
    """Does ``nxt`` go on with the sentence the group left open? Speech in the same language (and by the same
    speaker, on a ``diarize`` stream) with words after a piece without final punctuation, or speech that starts in
    lower case (the full stop before it was put there at the cut)."""
    last = group[-1]
    return nxt.speech and bool(nxt.text.strip()) and nxt.lang == last.lang and nxt.speaker == last.speaker and (
        not ends_sentence(last.text) or continues(nxt.text))


def open_note(group: Sequence[Heard], why: str) -> str | None:
    """What a group translated with its sentence still open says (``why`` it was not completed); None when its
    last words end a sentence."""
    if ends_sentence(group[-1].text):
        return None
    return f"cut at the maximum utterance length mid-sentence, and translated before the sentence ended: {why}"


def share(group: Sequence[Final], whole: Final) -> None:
    """Cut ``whole`` (the group's words translated as one text) back onto the group's finals: each target's
    translation spread by each final's share of the source; the failures, notes, slides and route marks of that
    one translation go with every piece, and each untranslated word with the piece that holds it (else the last)."""
    weights = [len(f.source_text.strip()) for f in group]
    pieces = {t: spread(text, weights, t) for t, text in whole.translations.items()}
    first = next(iter(whole.translations), None)  # the stream's first target (whole.text)
    for i, f in enumerate(group):
        f.translations = {t: p[i] for t, p in pieces.items()}
        f.text = f.translations[first] if first is not None else ""
        f.failed, f.note, f.low_confidence = whole.failed, whole.note, whole.low_confidence
        f.slides, f.slide_terms = list(whole.slides), list(whole.slide_terms)
        f.latency_ms = {**f.latency_ms, "mt": whole.latency_ms.get("mt", 0.0)}
        f.untranslated = None
    for target, words in (whole.untranslated or {}).items():
        for word in words:
            owner = next((f for f in group if word in f.translations.get(target, "")), group[-1])
            owner.untranslated = owner.untranslated or {}
            owner.untranslated.setdefault(target, []).append(word)


def add_note(final: Final, note: str | None) -> None:
    if note:
        final.note = f"{final.note}; {note}" if final.note else note
