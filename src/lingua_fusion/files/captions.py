"""Segments -> SRT / WebVTT captions."""

from __future__ import annotations

from ..types import Segment


def _ts(seconds: float, sep: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_srt(segments: list[Segment]) -> str:
    blocks = []
    for i, s in enumerate(segments, 1):
        blocks.append(f"{i}\n{_ts(s.start, ',')} --> {_ts(max(s.end, s.start + 0.001), ',')}\n{s.text}\n")
    return "\n".join(blocks)


def to_vtt(segments: list[Segment]) -> str:
    blocks = ["WEBVTT\n"]
    for s in segments:
        blocks.append(f"{_ts(s.start, '.')} --> {_ts(max(s.end, s.start + 0.001), '.')}\n{s.text}\n")
    return "\n".join(blocks)
