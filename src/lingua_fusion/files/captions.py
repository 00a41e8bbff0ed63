"""Segments (and a video's slides) -> SRT / WebVTT captions.

Slides are cues of their own, interleaved with the captions by start time and labelled ``[slide]``, shown at the
top of the picture so they do not cover the spoken captions at the bottom: WebVTT says so with standard cue
settings (``line:0``), SRT has no standard position, so its slide cues start with ``{\\an8}``, the override that
VLC, mpv, MPC-HC and ffmpeg/libass read as "top centre" (a player that does not know it shows it as text).

A diarized segment names its speaker: WebVTT with its voice span (``<v S1>text``, which players show as the
speaker's name or style), SRT, which has no such tag, with the label before the text (``S1: text``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..types import Segment, SlideText

SLIDE_LABEL = "[slide]"
VTT_SLIDE_SETTINGS = "line:0 position:50% align:center"
SRT_SLIDE_TAG = "{\\an8}"


def _ts(seconds: float, sep: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _cues(segments: list[Segment], slides: Sequence[SlideText]) -> list[tuple[float, float, str, bool, str | None]]:
    """(start, end, text, is_slide, speaker) in start order; a slide's text without blank lines (a blank line ends
    a cue)."""
    cues = [(s.start, s.end, s.text, False, s.speaker) for s in segments]
    for sl in slides:
        text = "\n".join(ln for ln in sl.text.replace("-->", "->").splitlines() if ln.strip())
        if text:
            cues.append((sl.start, sl.end, text, True, None))
    return sorted(cues, key=lambda c: (c[0], c[3]))


def to_srt(segments: list[Segment], slides: Sequence[SlideText] = ()) -> str:
    blocks = []
    for i, (start, end, text, slide, speaker) in enumerate(_cues(segments, slides), 1):
        body = f"{SRT_SLIDE_TAG}{SLIDE_LABEL} {text}" if slide else (f"{speaker}: {text}" if speaker else text)
        blocks.append(f"{i}\n{_ts(start, ',')} --> {_ts(max(end, start + 0.001), ',')}\n{body}\n")
    return "\n".join(blocks)


def to_vtt(segments: list[Segment], slides: Sequence[SlideText] = (), *, karaoke: bool = False) -> str:
    """WebVTT cues; ``karaoke``: a segment with words (``Segment.words``) shows them as a line of its own with a
    timestamp tag before each word (WebVTT's karaoke style: players paint each word from its time), above the
    translation when there is one."""
    blocks = ["WEBVTT\n"]
    spoken = {(s.start, s.end, s.text): s for s in segments if karaoke and s.words}
    for start, end, text, slide, speaker in _cues(segments, slides):
        timing = f"{_ts(start, '.')} --> {_ts(max(end, start + 0.001), '.')}"
        voice = f"<v {speaker}>" if speaker else ""
        if slide:
            blocks.append(f"{timing} {VTT_SLIDE_SETTINGS}\n{SLIDE_LABEL} {_vtt_escape(text)}\n")
        elif (seg := spoken.get((start, end, text))) is not None:
            line = voice + _karaoke(seg)
            blocks.append(f"{timing}\n{line}\n" if text == seg.source_text
                          else f"{timing}\n{line}\n{voice}{_vtt_escape(text)}\n")
        elif speaker:
            blocks.append(f"{timing}\n{voice}{_vtt_escape(text)}\n")
        else:
            blocks.append(f"{timing}\n{text}\n")
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _karaoke(seg: Segment) -> str:
    """ "The <00:00:00.300>quick <00:00:00.540>brown": the first word shows with the cue, each next one at its
    start (a tag may not come before the cue's start: a word timed there is clamped to it)."""
    assert seg.words
    parts = [_vtt_escape(seg.words[0].word)]
    for w in seg.words[1:]:
        parts.append(f"<{_ts(max(w.start, seg.start), '.')}>{_vtt_escape(w.word)}")
    return " ".join(parts)
