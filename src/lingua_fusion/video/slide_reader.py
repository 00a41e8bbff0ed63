"""The slides consumer of a video file: change detection on every sampled frame, OCR only on a settled change.

``SlideReader`` is a ``FrameConsumer``. ``offer`` computes a signature (about a millisecond) and asks the detector;
a settled change is handed to one OCR worker thread through a queue of two, so decoding goes on while a slide is
read and a decoder that outruns OCR waits instead of piling up frames. ``finish`` waits for the reads and turns
them into timed slides (``build_slides``: the pure part, tested on its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import BackendError
from ..models.base import OCRLine
from .frames import FrameStats, VideoFrame
from .slides import Change, DetectorConfig, Row, SlideDetector, reading_order, same_text, signature

MAX_READS = 400  # OCR calls one file may cost (a 1-hour talk changes slide far fewer times)
OCR_QUEUE = 2  # settled frames waiting for OCR at once (each is one RGB frame in memory)
OCR_WAIT_S = 120.0  # one OCR call that takes longer than this is a hung backend


@dataclass(frozen=True)
class Read:
    start: float  # when the picture first appeared
    rows: list[Row]  # empty: a blank picture, or one with no text


@dataclass
class SlideSpan:
    start: float
    end: float
    rows: list[Row] = field(default_factory=list)

    @property
    def source_text(self) -> str:
        return "\n".join(r.text for r in self.rows)


MIN_SLIDE_CHARS = 3  # letters or digits a picture's text needs to be a slide ("K" on a sleeve is not one)


def substantive(rows: list[Row]) -> bool:
    return sum(ch.isalnum() for row in rows for ch in row.text) >= MIN_SLIDE_CHARS


def build_slides(reads: list[Read], end_t: float) -> list[SlideSpan]:
    """Reads in time order -> slides: each lasts until the next different picture (or the end); consecutive reads of
    the same text are one slide (a cursor or a speaker walked past), and so is a build (the slide gained rows: a
    bullet appeared, a line was written on the whiteboard; the slide keeps its start and takes the fuller text);
    a read with no text ends the slide before."""
    slides: list[SlideSpan] = []
    current: SlideSpan | None = None
    for r in sorted(reads, key=lambda r: r.start):
        if not substantive(r.rows):  # a stray letter OCR found on a hand or a face: no slide
            r = Read(r.start, [])
        text = "\n".join(row.text for row in r.rows)
        if current is not None and r.rows and same_text(current.source_text, text):
            continue
        if current is not None and r.rows and _grew(current.rows, r.rows):
            current.rows = list(r.rows)
            continue
        if current is not None:
            current.end = r.start
            slides.append(current)
            current = None
        if r.rows:
            current = SlideSpan(start=r.start, end=end_t, rows=list(r.rows))
    if current is not None:
        current.end = max(current.start, end_t)
        slides.append(current)
    return slides


def _grew(before: list[Row], after: list[Row]) -> bool:
    """Every row of ``before`` is still there in ``after`` (read alike), in order, and ``after`` has more."""
    if len(after) <= len(before):
        return False
    i = 0
    for row in after:
        if i < len(before) and same_text(before[i].text, row.text):
            i += 1
    return i == len(before)


class SlideReader:
    """FrameConsumer: reads a file's slides. ``ocr(rgb)`` returns OCR lines (any order); it runs on one worker."""

    def __init__(self, ocr: Callable[[np.ndarray], list[OCRLine]], cfg: DetectorConfig | None = None, *,
                 max_reads: int = MAX_READS) -> None:
        self._ocr = ocr
        self.detector = SlideDetector(cfg)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slide-ocr")
        self._room = threading.BoundedSemaphore(OCR_QUEUE)
        self._reads: list[tuple[Change, Future[list[OCRLine]] | None]] = []
        self._max_reads = max_reads
        self._last_t = 0.0
        self._last_rgb: np.ndarray | None = None
        self.decoded = 0
        self.analysed = 0
        self.capped = False  # MAX_READS reached: later changes were not read

    def offer(self, frame: VideoFrame) -> None:
        self.decoded += 1
        self._last_t, self._last_rgb = frame.t, frame.rgb
        self._take(self.detector.observe(frame.t, signature(frame.rgb)), frame.rgb)

    def _take(self, change: Change | None, rgb: np.ndarray) -> None:
        if change is None:
            return
        if change.blank:
            self._reads.append((change, None))
            return
        if self.analysed >= self._max_reads:
            self.capped = True
            return
        if not self._room.acquire(timeout=OCR_WAIT_S):
            raise BackendError(f"the OCR backend did not answer in {OCR_WAIT_S:.0f} s")
        self.analysed += 1
        fut = self._pool.submit(self._ocr, rgb)
        fut.add_done_callback(lambda _f: self._room.release())
        self._reads.append((change, fut))

    def stats(self) -> FrameStats:
        return FrameStats(decoded=self.decoded, analysed=self.analysed)

    def finish(self, end_t: float | None = None) -> list[SlideSpan]:
        """The last frame was offered: flush the detector, wait for every OCR call, return the slides."""
        end = max(self._last_t, end_t or 0.0)
        if self._last_rgb is not None:
            self._take(self.detector.finish(end), self._last_rgb)
        try:
            reads = [Read(c.start, reading_order(f.result(timeout=OCR_WAIT_S)) if f is not None else [])
                     for c, f in self._reads]
        finally:
            self.close()
        return build_slides(reads, end)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
