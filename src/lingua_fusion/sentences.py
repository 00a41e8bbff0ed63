"""Where sentences end in a transcript, and one translation cut back onto the pieces it was made from (pure).

Shared by the file path (files/sentences.py: Whisper's segments) and live streams (stream/finals.py: utterances
cut at the maximum length): MT is given whole sentences, and each piece of speech gets its share of the result.
"""

from __future__ import annotations

from collections.abc import Sequence

ENDS = (".", "!", "?", "…", "。", "！", "？", ";", "；", ":", "：")
CLOSERS = "\"'”’»)]」』"
UNSPACED = {"zh", "ja"}  # scripts written without spaces between words


def ends_sentence(text: str) -> bool:
    return text.rstrip().rstrip(CLOSERS).endswith(ENDS)


def continues(text: str) -> bool:
    """A piece that starts in lower case continues the sentence before it, whatever punctuation Whisper put at
    the cut ("... bring these." | "things with her ...")."""
    first = text.lstrip()[:1]
    return first.isalpha() and first.islower()


def join(texts: Sequence[str], lang: str | None) -> str:
    """The pieces' texts as one; a full stop before a piece that continues the sentence is dropped."""
    parts = [t.strip() for t in texts if t.strip()]
    parts = [p[:-1] if p.endswith(".") and i + 1 < len(parts) and continues(parts[i + 1]) else p
             for i, p in enumerate(parts)]
    return ("" if lang in UNSPACED else " ").join(parts)


def spread(translation: str, weights: Sequence[int], lang: str | None) -> list[str]:
    """``translation`` cut into ``len(weights)`` pieces, piece i about ``weights[i]`` / sum of the text, cut at the
    space nearest each share (CJK targets: at the character). Pieces joined back give the translation."""
    n = len(weights)
    if n == 1:
        return [translation]
    text = translation.strip()
    unspaced = lang in UNSPACED
    cuts: list[int] = []
    total = max(1, sum(max(1, w) for w in weights))
    acc = 0
    for w in weights[:-1]:
        acc += max(1, w)
        want = round(len(text) * acc / total)
        lo = cuts[-1] if cuts else 0
        cut = want if unspaced else _nearest_space(text, want, lo)
        cuts.append(max(lo, min(cut, len(text))))
    pieces, start = [], 0
    for cut in [*cuts, len(text)]:
        pieces.append(text[start:cut].strip())
        start = cut
    return pieces


def _nearest_space(text: str, want: int, lo: int) -> int:
    """The index of the space nearest ``want`` (not before ``lo``); ``want`` itself when there is none."""
    spaces = [i for i, ch in enumerate(text) if ch == " " and i >= lo]
    if not spaces:
        return max(lo, want)
    return min(spaces, key=lambda i: abs(i - want))
