"""A stream's audio on its own clock: time 0 is the first audio sample.

Chunks carry media timestamps (seconds on the client's clock). A chunk is written where its timestamp says:
a gap becomes silence (not a shift), a late or out-of-order chunk inside the reorder window lands in its place,
one older than the window (or before audio already consumed) is dropped and counted. A chunk placed over audio
already received (not into a gap's silence) overwrites it and is counted as ``overlapped``: both are a client's
clock running backward, which the stream tells its client (stream/ingest.py). Memory is bounded: audio before
``consumed`` is released (at each commit, and in a pause up to the open utterance's start: ``release``), the buffer
never holds more than ``max_buffer_s``, and the gaps remembered are those inside the reorder window, at most 256.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import SR


@dataclass
class TimelineStats:
    chunks: int = 0
    late_dropped: int = 0
    reordered: int = 0
    gap_seconds: float = 0.0
    overlapped: int = 0  # chunks written over audio already received (by more than OVERLAP_SLACK)


OVERLAP_SLACK = SR // 100  # 10 ms: timestamps rounded to the millisecond never count as an overlap
MAX_GAPS = 256


class AudioTimeline:
    def __init__(self, *, reorder_window_s: float = 2.0, max_buffer_s: float = 60.0) -> None:
        self.reorder_window = reorder_window_s
        self.max_buffer = int(max_buffer_s * SR)
        self.origin: float | None = None  # client timestamp of stream time 0
        self.start = 0  # sample index (stream time) of buf[0]
        self.buf = np.zeros(0, dtype=np.float32)
        self.end = 0  # furthest sample written
        self.stats = TimelineStats()
        self.gaps: list[tuple[int, int]] = []  # [a, b) silence inserted for a gap, not yet filled (reorder window)

    @property
    def end_s(self) -> float:
        return self.end / SR

    def write(self, samples: np.ndarray, ts: float | None = None) -> bool:
        """Place ``samples`` at client time ``ts`` (None: right after the furthest sample). False if dropped. An
        empty chunk places nothing: it neither sets the clock (the first chunk's ``ts`` does) nor counts as dropped."""
        if len(samples) == 0:
            return True
        self.stats.chunks += 1
        if ts is None:
            pos = self.end
        else:
            if self.origin is None:
                self.origin = ts - self.end / SR
            pos = int(round((ts - self.origin) * SR))
        if self.origin is None:
            self.origin = 0.0
        n = len(samples)
        if pos + n <= self.start or self.end - pos > self.reorder_window * SR:
            self.stats.late_dropped += 1
            return False
        if pos < self.start:  # partly before consumed audio: keep the part after it
            samples = samples[self.start - pos:]
            pos = self.start
            n = len(samples)
        if pos < self.end:
            self.stats.reordered += 1
            if min(pos + n, self.end) - pos - self._fill(pos, pos + n) > OVERLAP_SLACK:
                self.stats.overlapped += 1
        elif pos > self.end:
            self.stats.gap_seconds += (pos - self.end) / SR
            self.gaps.append((self.end, pos))
            floor = pos - int(self.reorder_window * SR)  # a chunk before this is dropped: its gap cannot be filled
            self.gaps = [(a, b) for a, b in self.gaps if b > floor][-MAX_GAPS:]
        need = pos + n - self.start
        if need > len(self.buf):
            if need > self.max_buffer:
                # never grow without bound: release the oldest audio (the caller consumes long before this)
                cut = pos + n - self.max_buffer
                self.consume(cut)
                if self.start < min(cut, pos):  # a gap longer than the buffer: release its silence too
                    self.start = min(cut, pos)
                need = pos + n - self.start
            grown = np.zeros(need, dtype=np.float32)
            grown[: len(self.buf)] = self.buf
            self.buf = grown
        self.buf[pos - self.start: pos - self.start + n] = samples
        self.end = max(self.end, pos + n)
        return True

    def _fill(self, a: int, b: int) -> int:
        """[a, b) is written: the gap samples it fills (removed from ``gaps``)."""
        filled, left = 0, []
        for ga, gb in self.gaps:
            lo, hi = max(a, ga), min(b, gb)
            if lo >= hi:
                left.append((ga, gb))
                continue
            filled += hi - lo
            left += [(x, y) for x, y in ((ga, lo), (hi, gb)) if x < y]
        self.gaps = left
        return filled

    def view(self, t0: float, t1: float | None = None) -> np.ndarray:
        a = max(self.start, int(round(t0 * SR)))
        b = self.end if t1 is None else min(self.end, int(round(t1 * SR)))
        if b <= a:
            return np.zeros(0, dtype=np.float32)
        return self.buf[a - self.start: b - self.start]

    def consume(self, upto_sample: int) -> None:
        upto = min(max(upto_sample, self.start), self.end)
        if upto == self.start:
            return  # nothing to release: no copy
        self.buf = self.buf[upto - self.start:].copy()
        self.start = upto

    def release(self, before_s: float) -> None:
        """Audio before stream time ``before_s`` will not be read again (the silence behind the open utterance):
        let it go now rather than at the next commit, which a long pause puts off (without this, a pause held up to
        ``max_buffer_s`` of silence, 3.8 MB, copied on every write). The reorder window behind the furthest sample
        is kept, so a late chunk is placed, or dropped, exactly as before."""
        self.consume(min(int(round(before_s * SR)), self.end - int(self.reorder_window * SR)))

    def consume_s(self, t: float) -> None:
        self.consume(int(round(t * SR)))
