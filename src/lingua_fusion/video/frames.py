"""The contract between video decoding and what reads video frames (slide detection, landmark extraction).

A decoder (a file's video track, a stream's frame messages or WebM video) produces ``VideoFrame`` values in media-time
order and offers each to every registered ``FrameConsumer``. A consumer decides for itself whether a frame is worth
analysing (a slide detector compares a downscaled copy, a landmark sampler follows motion within its budget) and must
return quickly: heavy work goes to the executor, never onto the caller's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class VideoFrame:
    t: float  # media time of the frame, seconds from the start of the file or stream
    rgb: np.ndarray  # H x W x 3, uint8, RGB

    @property
    def size(self) -> tuple[int, int]:
        return int(self.rgb.shape[1]), int(self.rgb.shape[0])


@dataclass(frozen=True, slots=True)
class FrameStats:
    decoded: int  # frames the decoder produced
    analysed: int  # frames a consumer actually analysed (OCR, landmarks)


class FrameConsumer(Protocol):
    def offer(self, frame: VideoFrame) -> None:
        """Look at one decoded frame (in media-time order); analyse it now, later, or never."""

    def stats(self) -> FrameStats: ...
