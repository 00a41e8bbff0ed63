"""Whole sentences for MT, segment times for the result (pure).

Whisper cuts a recording into segments at pauses and at its 30 s windows, not at sentence ends: one sentence often
spans two segments ("... bring these" | "things with her from the store."), and MT given each piece alone
translates neither right. ``sentence_groups`` joins consecutive segments until one ends a sentence (terminal
punctuation) or a long pause, a change of speaker or a length cap ends the group; MT translates each group once;
``spread`` puts the translation back on the group's segments, each piece sized like its segment's share of the
source, cut between words (CJK: between characters), so captions keep their times. The text helpers are
lingua_fusion/sentences.py's, shared with live streams.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sentences import continues, ends_sentence, join, spread
from ..types import Segment

__all__ = ["continues", "ends_sentence", "join", "sentence_groups", "spread"]

MAX_PAUSE_S = 1.5  # a longer silence between two segments ends the sentence, punctuated or not
MAX_CHARS = 800  # one MT input at most (a run-on transcript without punctuation is still cut)


def sentence_groups(segs: Sequence[Segment], *, max_pause_s: float = MAX_PAUSE_S,
                    max_chars: int = MAX_CHARS) -> list[list[int]]:
    """Indices of ``segs`` in groups of consecutive segments that make whole sentences."""
    groups: list[list[int]] = []
    size = 0
    for i, seg in enumerate(segs):
        if groups and (continues(seg.source_text) or not ends_sentence(segs[groups[-1][-1]].source_text)) \
                and seg.start - segs[groups[-1][-1]].end <= max_pause_s \
                and seg.speaker == segs[groups[-1][-1]].speaker \
                and size + len(seg.source_text) <= max_chars:
            groups[-1].append(i)
            size += len(seg.source_text)
        else:
            groups.append([i])
            size = len(seg.source_text)
    return groups
