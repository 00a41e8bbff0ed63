"""A segment's timed words kept true to its text (pure).

Whisper's words (``ASRSegment.words``) are what it decoded; the text users see can change after that: a decoder
loop cut (models/transcript_guard.py), a slide term corrected (video/context.py), Mandarin's script converted. A
word list that still says "the the the" under a text that says "the" would be a second transcript, so the words
follow the text: ``realigned`` matches the old words to the new text's words and times each new word from the
old ones it replaces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from difflib import SequenceMatcher

from .base import ASRWord

# what a request for word times is told where the torch port serves ASR (NotConfigured, 501)
WORDS_NEED_CT2 = ("word timestamps need the CTranslate2 Whisper backend (models.backend = \"ctranslate2\"): this "
                  "server runs the torch port, which does not time words")


def shifted(words: Sequence[ASRWord], seconds: float) -> list[ASRWord]:
    """``words`` ``seconds`` later: a piece's words on the file's clock (files/speech.py)."""
    return [replace(w, start=round(w.start + seconds, 3), end=round(w.end + seconds, 3)) for w in words]


def _key(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def realigned(words: Sequence[ASRWord], text: str) -> list[ASRWord]:
    """The words of ``text`` (split at spaces) timed from ``words``: a word kept (case and punctuation aside) keeps
    its time and probability; a run that replaces old words shares their span evenly, at their lowest
    probability; a word with nothing to replace gets a zero-length time where it stands. Old words left out
    of ``text`` are dropped. Unchanged text gives the words back as they were; no words (none were asked for)
    stay none."""
    if not words:
        return []
    new = text.split()
    if "".join(w.word for w in words) == "".join(new):  # unchanged (Mandarin's words have no spaces between)
        return list(words)
    out: list[ASRWord] = []
    old_keys, new_keys = [_key(w.word) for w in words], [_key(w) for w in new]
    for op, i1, i2, j1, j2 in SequenceMatcher(None, old_keys, new_keys, autojunk=False).get_opcodes():
        if op == "equal":
            out += [replace(w, word=t) for w, t in zip(words[i1:i2], new[j1:j2], strict=True)]
        elif op == "replace":
            start, end = words[i1].start, words[i2 - 1].end
            step = (end - start) / (j2 - j1)
            prob = min(w.probability for w in words[i1:i2])
            out += [ASRWord(t, round(start + k * step, 3), round(start + (k + 1) * step, 3), prob)
                    for k, t in enumerate(new[j1:j2])]
        elif op == "insert":
            at = words[i1 - 1].end if i1 > 0 else words[0].start
            out += [ASRWord(t, at, at, 0.0) for t in new[j1:j2]]
    return out


def rewritten(words: Sequence[ASRWord], convert: Callable[[str], str]) -> list[ASRWord]:
    """Each word's text through ``convert`` (Mandarin's script, character for character), times kept."""
    return [replace(w, word=convert(w.word)) for w in words]
