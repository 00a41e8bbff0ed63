"""Who spoke each segment of a file's speech (``diarize=true``): the voice between pauses embedded on the engine,
clustered into speakers (speakers/cluster.py), labelled "S1", "S2", ... in order of appearance.

Whisper's segments do not end at every change of speaker: quick turns ("Yes." "Are you sure?") come back as one
segment. So a segment's audio is cut at its pauses (``PAUSE_S`` of quiet or more) into parts, each part's voice
(its quiet frames left out) is embedded as 1.6 s windows (``diarize.window_hop_s`` apart, at most
``diarize.max_windows_per_segment``; a shorter part is repeated to fill one) whose mean is the part's embedding,
and the parts are clustered, parts of at least ``MIN_OPEN_S`` finding the speakers. A segment whose parts belong
to more than one speaker is split at the pauses where the speaker changes; its text is divided in proportion to
the parts' durations, at the sentence or clause end nearest each share (else the nearest space): without word
times that division is approximate. Overlapping speech gets the one speaker of most of it.

The windows run through the engine like every other model call of a file (``ModelKey.spk``, one
``SpeakerInput`` per part): a batch of parts is one forward of the voice encoder, and a file's work shares the
encoder fairly with other keys' files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..config import DiarizeSettings
from ..errors import TooLarge
from ..serving.ports import SpeakerInput
from ..speakers.cluster import SHORT_SLACK, Assignment, label_all
from ..speakers.voiced import FRAME, QUIET, frame_rms, voiced
from ..types import Segment, Word
from .engine import EngineLink
from .pieces import RATE
from .work import Work

PAUSE_S = 0.2  # quiet this long inside a segment may be a change of speaker
MIN_PART_S = 0.15  # shorter voiced runs are breaths and clicks: joined to their neighbour
MIN_OPEN_S = 1.0  # parts with this much voice find the speakers; shorter ones are only scored against them
SPEAKER_MODEL = "resemblyzer-voice-encoder"
_CLAUSE_END = re.compile(r"[.!?;:,。！？，]\s")


@dataclass(frozen=True)
class Part:
    """A run of voice inside a segment, in samples of the file."""

    segment: int
    start: int
    end: int


def parts_of(audio: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) sample offsets of the voiced runs in ``audio`` separated by ``PAUSE_S`` of quiet or more."""
    rms = frame_rms(audio)
    if len(rms) < 2:
        return [(0, len(audio))] if len(audio) else []
    loud = float(np.percentile(rms, 90))
    if loud <= 1e-4:
        return []
    on = np.flatnonzero(rms >= QUIET * loud)
    gap = int(PAUSE_S * RATE / FRAME)
    runs: list[list[int]] = []
    for f in on:
        if runs and f - runs[-1][1] <= gap:
            runs[-1][1] = int(f)
        else:
            runs.append([int(f), int(f)])
    spans = [(a * FRAME, (b + 1) * FRAME) for a, b in runs]
    merged: list[tuple[int, int]] = []
    for a, b in spans:  # a click or breath joins the run before it (or after it, when first)
        if merged and (b - a < MIN_PART_S * RATE or merged[-1][1] - merged[-1][0] < MIN_PART_S * RATE):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def split_text(text: str, weights: list[float]) -> list[str]:
    """``text`` in ``len(weights)`` pieces sized by ``weights``, each cut at the clause end nearest its share
    (within a fifth of the text), else at the nearest space. Pieces joined back give the text."""
    text = text.strip()
    ends = [m.end() - 1 for m in _CLAUSE_END.finditer(text)]
    spaces = [i for i, ch in enumerate(text) if ch == " "]
    total, acc, cuts = max(1e-9, sum(weights)), 0.0, [0]
    for w in weights[:-1]:
        acc += w
        want = round(len(text) * acc / total)
        near = [i for i in ends if i > cuts[-1] and abs(i - want) <= len(text) / 5] or \
            [i for i in spaces if i > cuts[-1]] or [want]
        cuts.append(max(cuts[-1], min(len(text), min(near, key=lambda i: abs(i - want)))))
    cuts.append(len(text))
    return [text[a:b].strip() for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


class SpeakerLabeller:
    def __init__(self, settings: DiarizeSettings, engine: Callable[[], EngineLink]) -> None:
        self.settings = settings
        self.engine = engine

    def check_length(self, duration_s: float) -> None:
        """TooLarge (413) for speech longer than ``diarize.max_audio_s``: refused after decoding, before ASR."""
        most = self.settings.max_audio_s
        if duration_s > most:
            raise TooLarge(f"diarize takes at most {most:.0f} s of speech; this file has {duration_s:.0f} s",
                           details={"limit": "diarize.max_audio_s", "field": "diarize", "max": most})

    def label(self, audio: np.ndarray, segments: list[Segment], work: Work,
              max_speakers: int | None) -> list[Segment]:
        """The segments with ``speaker`` and ``speaker_confidence`` (a segment with no voice keeps None), a
        segment of two speakers split in two; a warning when the request's speaker cap was reached."""
        if not segments:
            return segments
        s = self.settings
        parts = [Part(i, a + int(seg.start * RATE), b + int(seg.start * RATE)) for i, seg in enumerate(segments)
                 for a, b in parts_of(audio[int(seg.start * RATE):int(seg.end * RATE)])]
        hop = max(1, int(s.window_hop_s * RATE))
        items = [SpeakerInput(voiced(audio[p.start:p.end]), hop, s.max_windows_per_segment) for p in parts]
        embedded = self.engine().embed_speakers(items, work.call) if items else []
        means = [w.mean(axis=0) if len(w) else None for w in embedded]
        cap = max_speakers or s.max_speakers
        found = label_all(means, [(p.end - p.start) / RATE for p in parts], threshold=s.threshold,
                          max_speakers=cap, min_weight=MIN_OPEN_S, slack=SHORT_SLACK)
        out: list[Segment] = []
        for i, seg in enumerate(segments):
            mine = [(p, a) for p, a in zip(parts, found, strict=True) if p.segment == i and a is not None]
            out += split_by_speaker(seg, mine)
        work.models["speaker"] = SPEAKER_MODEL
        count = len({a.index for a in found if a is not None})
        if count >= cap and cap < s.max_speakers:
            work.warnings.append(f"diarize: {count} speakers, the most max_speakers allows; a voice beyond them "
                                 "was given the closest speaker (see speaker_confidence)")
        return out


def split_by_speaker(seg: Segment, parts: list[tuple[Part, Assignment]]) -> list[Segment]:
    """``seg`` labelled with its parts' speaker, or split where consecutive parts have different speakers."""
    if not parts:
        return [seg]
    runs: list[list[tuple[Part, Assignment]]] = []
    for p, a in parts:
        if runs and runs[-1][-1][1].index == a.index:
            runs[-1].append((p, a))
        else:
            runs.append([(p, a)])
    spans = _spans(seg, runs)
    words: list[list[Word] | None] = [None] * len(runs)
    if len(runs) > 1 and seg.words:  # the words asked for (word_timestamps) say where the text changes hands
        words = [[w for w in seg.words if a <= (w.start + w.end) / 2 < b] for a, b in spans]
        words[-1] = [w for w in seg.words if (w.start + w.end) / 2 >= spans[-1][0]]
        texts = [" ".join(w.word for w in ws) for ws in words if ws is not None]  # words have no spaces
    elif len(runs) > 1:  # else by each run's share of the voiced time, at the nearest clause end
        texts = split_text(seg.source_text, [sum(p.end - p.start for p, _a in r) for r in runs])
    else:
        texts = [seg.source_text]
    if any(not t for t in texts):  # too little text to share: the segment goes to its main speaker
        main = max(runs, key=lambda r: sum(p.end - p.start for p, _a in r))
        runs, texts = [[pa for r in runs for pa in r if pa[1].index == main[0][1].index]], [seg.source_text]
        spans, words = [(seg.start, seg.end)], [seg.words]
    out = []
    for run, text, (start, end), ws in zip(runs, texts, spans, words, strict=True):
        voice = sum(p.end - p.start for p, _a in run)
        conf = sum((p.end - p.start) * a.confidence for p, a in run) / max(1, voice)
        out.append(seg.model_copy(update={"start": start, "end": end, "source_text": text, "text": text,
                                          "speaker": run[0][1].label, "speaker_confidence": round(conf, 3),
                                          "words": ws if len(runs) > 1 else seg.words}))
    return out


def _spans(seg: Segment, runs: list[list[tuple[Part, Assignment]]]) -> list[tuple[float, float]]:
    """Each run's (start, end) in seconds: the segment's own ends outside, halfway through the pause between
    two runs inside."""
    spans = []
    for k, run in enumerate(runs):
        start = seg.start if k == 0 else round((runs[k - 1][-1][0].end + run[0][0].start) / 2 / RATE, 3)
        end = seg.end if k == len(runs) - 1 else round((run[-1][0].end + runs[k + 1][0][0].start) / 2 / RATE, 3)
        spans.append((start, end))
    return spans
