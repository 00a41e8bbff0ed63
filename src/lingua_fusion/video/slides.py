"""Slide and whiteboard change detection, and reading order: the pure core (no I/O, time passed in).

A frame is reduced to a *signature*: a 128 x 72 grey image, each pixel the mean of a box of the frame (box
averaging also averages camera noise away). Two signatures differ when more than ``min_changed`` of their pixels
moved by more than ``pixel_delta`` grey levels, after removing the median shift (a camera's auto-exposure
brightens the whole picture: that is not a new slide) and skipping uniform regions (8 x 8 cells with no contrast in
either frame: an empty wall or background has nothing to read, only noise). A cursor or a laser pointer moves a
few pixels of the signature: under ``min_changed``. A new line of text moves dozens.

``SlideDetector.observe(t, signature)`` reports a ``Change`` once a new picture has stayed the same for
``settle_s`` (a fade, a camera pan or a slide build is not read mid-way), and only when the settled picture differs
from the last one reported: every other frame costs one subtraction and never an OCR call.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..models.base import OCRLine

SIG_W, SIG_H = 128, 72
CELL = 8  # uniform-region test in cells of CELL x CELL signature pixels


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    pixel_delta: float = 24.0  # grey levels (0-255) a signature pixel must move to count as changed
    min_changed: float = 0.004  # share of signature pixels that must change (0.4 %: ~37 of 9,216)
    settle_s: float = 0.45  # a picture must stay unchanged this long before it is read
    cell_contrast: float = 6.0  # a cell whose grey std is below this in both frames is uniform: skipped
    blank_std: float = 4.0  # a whole signature below this std is an empty picture (black, white): nothing to read
    busy_window: int = 8  # frames over which a pixel's moves are counted
    busy_moves: int = 4  # a pixel that moved (since the frame before) in this many of them is busy
    busy_share: float = 0.25  # busy pixels are ignored only while they are at most this share (a webcam inset,
    # a speaker walking by); more (a fade, a pan) is the whole picture changing, and nothing is ignored


@dataclass(frozen=True, slots=True)
class Change:
    start: float  # media time of the first frame showing the new picture (the slide's start)
    t: float  # media time at which it was judged settled (start + about settle_s)
    blank: bool  # an empty picture (no contrast anywhere): ends the previous slide, not read


def signature(rgb: np.ndarray) -> np.ndarray:
    """RGB frame -> SIG_H x SIG_W float32 grey, each pixel the mean of its box (cheap: ~1 ms for 1280 x 720)."""
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(rgb)).convert("L").resize((SIG_W, SIG_H), Image.Resampling.BOX)
    return np.asarray(img, dtype=np.float32)


def _cell_std(sig: np.ndarray) -> np.ndarray:
    h, w = sig.shape[0] // CELL * CELL, sig.shape[1] // CELL * CELL
    cells = sig[:h, :w].reshape(h // CELL, CELL, w // CELL, CELL)
    return cells.std(axis=(1, 3))


def moved(a: np.ndarray, b: np.ndarray, cfg: DetectorConfig) -> np.ndarray:
    """Signature pixels that changed between ``a`` and ``b`` (uniform cells and a global shift left out)."""
    d = b - a
    d -= float(np.median(d))
    out = np.abs(d) > cfg.pixel_delta
    content = (_cell_std(a) > cfg.cell_contrast) | (_cell_std(b) > cfg.cell_contrast)
    mask = np.zeros_like(out)
    h, w = content.shape[0] * CELL, content.shape[1] * CELL
    mask[:h, :w] = np.repeat(np.repeat(content, CELL, axis=0), CELL, axis=1)
    return out & mask


def changed_share(a: np.ndarray, b: np.ndarray, cfg: DetectorConfig, ignore: np.ndarray | None = None) -> float:
    """Share of signature pixels that changed between ``a`` and ``b``, leaving out ``ignore`` (busy regions)."""
    m = moved(a, b, cfg)
    if ignore is not None:
        m &= ~ignore
    return float(np.count_nonzero(m)) / m.size


def is_blank(sig: np.ndarray, cfg: DetectorConfig) -> bool:
    return float(sig.std()) < cfg.blank_std


class SlideDetector:
    """Feed it sampled signatures in media-time order; it says when a new picture has settled."""

    def __init__(self, cfg: DetectorConfig | None = None) -> None:
        self.cfg = cfg or DetectorConfig()
        self._anchor: np.ndarray | None = None  # the first frame of the current run of alike frames
        self._last: np.ndarray | None = None
        self._run_start = 0.0
        self._fired = False
        self._ref: np.ndarray | None = None  # the last picture reported
        self._ref_seen = 0.0  # the last frame time that still showed it
        self._left_at: float | None = None  # the first frame time after that which did not
        self._moves: deque[np.ndarray] = deque()  # "moved since the frame before", the last busy_window frames
        self._counts: np.ndarray | None = None  # their sum per pixel
        self._busy: np.ndarray | None = None
        self._first: tuple[float, np.ndarray] | None = None
        self.observed = 0
        self.changes = 0

    def _differs(self, a: np.ndarray, b: np.ndarray) -> bool:
        return changed_share(a, b, self.cfg, self._busy) > self.cfg.min_changed

    def _track_motion(self, t: float, sig: np.ndarray) -> None:
        """Regions that keep moving from frame to frame (a webcam inset, a speaker) are left out of the comparisons:
        a slide change moves its pixels once and a fade two or three times; motion moves them again and again."""
        if self._last is None:
            self._first = (t, sig)
            return
        now = moved(self._last, sig, self.cfg).astype(np.int16)
        self._moves.append(now)
        self._counts = now.copy() if self._counts is None else self._counts + now
        if len(self._moves) > self.cfg.busy_window:
            self._counts -= self._moves.popleft()
        busy = self._counts >= self.cfg.busy_moves
        self._busy = busy if 0 < np.count_nonzero(busy) <= self.cfg.busy_share * busy.size else None

    def observe(self, t: float, sig: np.ndarray) -> Change | None:
        self.observed += 1
        self._track_motion(t, sig)
        # compared with the run's first frame, not the previous one: a slow fade drifts past the threshold
        if self._anchor is None or self._differs(self._anchor, sig):
            self._anchor, self._run_start, self._fired = sig, t, False
        self._last = sig
        if self._ref is not None:
            if not self._differs(self._ref, sig):
                self._ref_seen, self._left_at = t, None
            elif self._left_at is None:
                self._left_at = t
        if not self._fired and t - self._run_start >= self.cfg.settle_s - 1e-6:
            return self._settle(t)
        return None

    def finish(self, t_end: float) -> Change | None:
        """The video ended: a picture shown until the end counts as settled even if shorter than ``settle_s``
        (but not a single last frame of a transition: it must have lasted a third of ``settle_s``)."""
        if self._anchor is None or self._fired or t_end - self._run_start < self.cfg.settle_s / 3:
            return None
        return self._settle(t_end)

    def _settle(self, t: float) -> Change | None:
        self._fired = True
        assert self._last is not None
        if self._ref is not None and not self._differs(self._ref, self._last):
            return None  # back to the picture already reported (a cursor moved, a fade in and out of the same)
        # the picture changed between the last frame that showed the old one and the first that did not: the middle
        # of that gap is the best guess (an abrupt cut is off by a quarter of a sampling period on average)
        start = self._run_start if self._ref is None or self._left_at is None else (self._ref_seen + self._left_at) / 2
        if self._ref is None and self._first is not None and not self._differs(self._first[1], self._last):
            start = self._first[0]  # shown from the first frame (motion elsewhere kept it from settling sooner)
        self._ref, self._ref_seen, self._left_at = self._last, t, None
        self.changes += 1
        return Change(start=round(start, 3), t=round(t, 3), blank=is_blank(self._last, self.cfg))


# ---- reading order -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Row:
    text: str
    box: tuple[float, float, float, float]
    confidence: float
    title: bool = False


def reading_order(lines: list[OCRLine]) -> list[Row]:
    """OCR boxes -> rows in reading order: the title first (a line clearly taller than the others, in the upper
    half), then rows top to bottom; boxes on one visual row are joined left to right. A box without a letter or a
    digit (a bullet, a cursor read as "●", a rule) is not text to translate."""
    boxes = [ln for ln in lines if any(ch.isalnum() for ch in ln.text)]
    if not boxes:
        return []
    heights = np.array([max(1.0, ln.box[3] - ln.box[1]) for ln in boxes])
    tol = float(np.median(heights)) * 0.5
    rows: list[list[OCRLine]] = []
    for ln in sorted(boxes, key=lambda b: (b.box[1] + b.box[3]) / 2):
        centre = (ln.box[1] + ln.box[3]) / 2
        if rows and abs(centre - (rows[-1][0].box[1] + rows[-1][0].box[3]) / 2) <= tol:
            rows[-1].append(ln)
        else:
            rows.append([ln])
    out = []
    for row in rows:
        row.sort(key=lambda b: b.box[0])
        box = (min(b.box[0] for b in row), min(b.box[1] for b in row), max(b.box[2] for b in row),
               max(b.box[3] for b in row))
        out.append(Row(" ".join(b.text.strip() for b in row), box, min(b.confidence for b in row)))
    if len(out) > 1:
        bottom = max(r.box[3] for r in out)
        hs = [r.box[3] - r.box[1] for r in out]
        i = int(np.argmax(hs))
        others = float(np.median([h for j, h in enumerate(hs) if j != i]))
        if hs[i] >= 1.3 * others and out[i].box[1] < bottom / 2:
            title = out.pop(i)
            out.insert(0, Row(title.text, title.box, title.confidence, title=True))
    return out


def same_text(a: str, b: str, threshold: float = 0.85) -> bool:
    """Two OCR readings of (nearly) the same slide: OCR of one picture under noise varies by a character or two."""
    from difflib import SequenceMatcher

    na, nb = " ".join(a.lower().split()), " ".join(b.lower().split())
    if na == nb:
        return True
    return bool(na and nb) and SequenceMatcher(None, na, nb).ratio() >= threshold


# ---- slide words as context ------------------------------------------------------------------------------------
# English capitalises these inside a sentence, but they are words to translate, not names to keep
NOT_NAMES = frozenset("""monday tuesday wednesday thursday friday saturday sunday january february march april may
june july august september october november december english spanish french german portuguese catalan italian
chinese japanese european american british i""".split())


def names_in(texts: list[str]) -> list[str]:
    """Names on slides that MT must keep as written: acronyms, words with digits, capitalised words inside a line
    (as the stream path does, stream/jobs.py), but not the days, months and languages English capitalises."""
    names: set[str] = set()
    for text in texts:
        for line in text.splitlines():
            words = re.findall(r"[A-Za-z][A-Za-z0-9]+", line)
            for i, w in enumerate(words):
                if w.lower() in NOT_NAMES:
                    continue
                if (w.isupper() and len(w) > 1) or any(c.isdigit() for c in w) or (i > 0 and w[0].isupper()):
                    names.add(w)
    return sorted(names)
