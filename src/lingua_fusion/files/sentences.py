"""Whole sentences for MT, segment times for the result (pure).

Whisper cuts a recording into segments at pauses and at its 30 s windows, not at sentence ends: one sentence often
spans two segments ("... bring these" | "things with her from the store."), and MT given each piece alone
translates neither right. ``sentence_groups`` joins consecutive segments until one ends a sentence (terminal
punctuation) or a long pause or a length cap ends the group; MT translates each group once; ``spread`` puts the
translation back on the group's segments, each piece sized like its segment's share of the source, cut between
words (CJK: between characters), so captions keep their times.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..types import Segment

ENDS = (".", "!", "?", "…", "。", "！", "？", ";", "；", ":", "：")
CLOSERS = "\"'”’»)]」』"
MAX_PAUSE_S = 1.5  # a longer silence between two segments ends the sentence, punctuated or not
MAX_CHARS = 800  # one MT input at most (a run-on transcript without punctuation is still cut)
UNSPACED = {"zh", "ja"}  # scripts written without spaces between words


def ends_sentence(text: str) -> bool:
    return text.rstrip().rstrip(CLOSERS).endswith(ENDS)


def continues(text: str) -> bool:
    """A segment that starts in lower case continues the sentence before it, whatever punctuation Whisper put at
    the pause ("... bring these." | "things with her ...")."""
    first = text.lstrip()[:1]
    return first.isalpha() and first.islower()


def sentence_groups(segs: Sequence[Segment], *, max_pause_s: float = MAX_PAUSE_S,
                    max_chars: int = MAX_CHARS) -> list[list[int]]:
    """Indices of ``segs`` in groups of consecutive segments that make whole sentences."""
    groups: list[list[int]] = []
    size = 0
    for i, seg in enumerate(segs):
        if groups and (continues(seg.source_text) or not ends_sentence(segs[groups[-1][-1]].source_text)) \
                and seg.start - segs[groups[-1][-1]].end <= max_pause_s \
                and size + len(seg.source_text) <= max_chars:
            groups[-1].append(i)
            size += len(seg.source_text)
        else:
            groups.append([i])
            size = len(seg.source_text)
    return groups


def join(texts: Sequence[str], lang: str | None) -> str:
    """The segments' texts as one; a full stop before a piece that continues the sentence is dropped."""
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
