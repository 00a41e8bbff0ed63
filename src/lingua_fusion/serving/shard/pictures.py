"""Pictures for OCR cross to the model process at the size OCR reads them, not as decoded.

A client's image may be 40 MP (``limits.max_image_pixels``): 120 MB of RGB, copied by msgpack on the worker's event
loop, written through the socket and read, unpacked and copied again on the model process's one event loop, while
every other stream's model replies waited behind it (attack 3 under ``serve --workers``). RapidOCR never reads
more than ``models/ocr.py READ_SIDE`` (2,000) pixels on the longer side: its preprocessing resizes a larger
picture first, and the detector and the recogniser's crops both read that resized picture. So the worker does that
same resize (``ocr.as_read``, step for step) on a thread before the picture crosses: the model process gets a
picture RapidOCR reads as it is, exactly what it would have read from the whole one, and the text and its reading
order are the same. A 6300x6300 picture crosses as 1984x1984 (11.8 MB, not 119 MB); a picture within 2,000 pixels
crosses as it is. The lines' boxes come back in the resized picture's pixels and are scaled to the client's
picture, as RapidOCR scales them itself.

Tesseract reads every pixel: with ``models.ocr_engine = "tesseract"`` pictures cross whole.
"""

from __future__ import annotations

import asyncio

import numpy as np

from ...config import Settings
from ...models.base import OCRLine
from ...models.ocr import as_read, read_size


def shrinks(settings: Settings, payload: object) -> bool:
    """This OCR payload is a picture the model process's OCR would resize before reading."""
    return (settings.models.ocr_engine == "rapidocr" and isinstance(payload, np.ndarray) and payload.ndim >= 2
            and read_size(payload.shape[1], payload.shape[0]) is not None)


async def as_read_off_loop(image: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """The picture as OCR reads it (resized on a worker thread: cv2 lets the loop run), and the factors (x, y)
    from its pixels back to ``image``'s."""
    small = await asyncio.to_thread(as_read, image)
    return small, (image.shape[1] / small.shape[1], image.shape[0] / small.shape[0])


def scaled(lines: object, scale: tuple[float, float]) -> object:
    """``lines`` (OCR's ``list[OCRLine]``) with their boxes in the client's picture's pixels (None, shed work, stays
    None)."""
    if not isinstance(lines, list):
        return lines
    sx, sy = scale
    return [OCRLine(ln.text, ln.confidence, (ln.box[0] * sx, ln.box[1] * sy, ln.box[2] * sx, ln.box[3] * sy))
            for ln in lines]
