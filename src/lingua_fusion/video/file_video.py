"""A video file's frames for the file path: decode once, fan out to the slide reader (and any registered consumer),
return the slides read. Called from ``FileTranslator`` in its worker thread (never on the event loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..config import Settings
from ..deadline import Deadline
from ..models.base import OCRLine
from .decode import VideoProbe, decode_frames, probe
from .fanout import FrameContext, FrameFanout, Tap, file_fanout
from .frames import FrameStats
from .slide_reader import SlideReader, SlideSpan
from .slides import names_in

if TYPE_CHECKING:
    from ..types import SlideText

SLIDE_FPS = 2.0  # slides are sampled twice a second: a change is found within about 0.5 s (+ the settle time)


@dataclass
class VideoRead:
    probe: VideoProbe
    slides: list[SlideSpan] = field(default_factory=list)
    stats: dict[str, FrameStats] = field(default_factory=dict)
    decoded: int = 0
    capped: bool = False  # more slide changes than one file may OCR: the later ones were not read
    ocr_model: str = ""

    def names(self) -> list[str]:
        return names_in([s.source_text for s in self.slides])


def read_video(data: bytes, settings: Settings, ocr: Callable[[np.ndarray], list[OCRLine]], ocr_model: str,
               ctx: FrameContext, *, deadline: Deadline | None = None) -> VideoRead:
    """Probe the container; when it has a video track, decode it at the rate its consumers want and read slides
    (``ocr``: an image's lines, on the engine; ``ocr_model``: its name for the result)."""
    info = probe(data, settings.limits)
    if not info.has_video:
        return VideoRead(info)
    reader = SlideReader(ocr)
    fanout: FrameFanout = file_fanout(ctx, [Tap("slides", reader, SLIDE_FPS)])
    try:
        info, decoded = decode_frames(data, settings.limits, fanout.offer, fps=fanout.fps, deadline=deadline)
    except BaseException:
        reader.close()
        raise
    slides = reader.finish(info.duration_s)
    return VideoRead(info, slides=slides, stats=fanout.stats(), decoded=decoded, capped=reader.capped,
                     ocr_model=ocr_model)


def slide_texts(slides: list[SlideSpan], translate: Callable[[list[str]], list[str]] | None,
                braille: Callable[[str], str] | None = None) -> list[SlideText]:
    """Slides -> ``SlideText`` results. ``translate(rows) -> rows`` translates every row of every slide in one
    call (None: nothing to translate, the text is the source); ``braille(text)`` adds each slide's braille."""
    from ..types import Segment, SlideText

    rows = [r.text for s in slides for r in s.rows]
    outs = translate(rows) if translate is not None and rows else rows
    out: list[SlideText] = []
    i = 0
    for s in slides:
        lines: list[Segment] = []
        for r in s.rows:
            lines.append(Segment(start=s.start, end=s.end, source_text=r.text, text=outs[i],
                                 confidence=round(r.confidence, 4)))
            i += 1
        text = "\n".join(ln.text for ln in lines)
        out.append(SlideText(start=round(s.start, 3), end=round(s.end, 3), source_text=s.source_text, text=text,
                             lines=lines, braille=braille(text) if braille is not None else None))
    return out
