"""OCR backends: RapidOCR (PP-OCR det/rec on onnxruntime, bundled) and Tesseract (Debian) as a fast alternative."""

from __future__ import annotations

import threading

import numpy as np

from ..errors import BackendError
from .base import BackendInfo, OCRLine

TESSDATA = "/usr/share/tesseract-ocr/5/tessdata/"
# RapidOCR's Global.max_side_len: a picture with a longer side is resized to this (each side then rounded to a
# multiple of 32) before its detector and recogniser see it; both read that picture, the recogniser's crops too
READ_SIDE = 2000
TESS_LANG = {"en": "eng", "zh": "chi_sim", "es": "spa", "fr": "fra", "de": "deu", "pt": "por", "ca": "cat"}


class RapidOCRBackend:
    info = BackendInfo(name="rapidocr-ppocr", task="ocr", languages=("en", "zh", "es", "fr", "de", "pt", "ca"),
                       licence="Apache-2.0", quality="printed text ~0% CER; 0.5-0.9 s per 1280x720 on 2 cores")

    def __init__(self) -> None:
        from rapidocr import RapidOCR

        self._engine = RapidOCR(params={"Det.limit_type": "max", "Det.limit_side_len": 960,
                                        "Global.max_side_len": READ_SIDE,
                                        "Global.use_cls": False, "Global.log_level": "error"})
        self._lock = threading.Lock()

    def recognize(self, image: np.ndarray, *, language: str | None = None) -> list[OCRLine]:
        from rapidocr.utils.output import RapidOCROutput

        with self._lock:
            try:
                res = self._engine(image)
            except Exception as exc:  # onnxruntime errors
                raise BackendError(f"rapidocr failed: {exc}") from exc
        # detection and recognition on (the engine's params): the whole pipeline's output, RapidOCROutput
        if not isinstance(res, RapidOCROutput) or res.txts is None or res.boxes is None or res.scores is None:
            return []
        lines = []
        for text, score, box in zip(res.txts, res.scores, res.boxes, strict=False):
            b = np.asarray(box)
            lines.append(OCRLine(text=str(text), confidence=float(score),
                                 box=(float(b[:, 0].min()), float(b[:, 1].min()),
                                      float(b[:, 0].max()), float(b[:, 1].max()))))
        return sort_reading_order(lines)


class TesseractBackend:
    info = BackendInfo(name="tesseract-5", task="ocr", languages=("en", "zh"), licence="Apache-2.0",
                       quality="fast (0.12 s/image); en 0.3% CER, zh 2.8% CER")

    def __init__(self) -> None:
        import shutil

        if shutil.which("tesseract") is None:
            raise BackendError("tesseract is not installed")

    def recognize(self, image: np.ndarray, *, language: str | None = None) -> list[OCRLine]:
        import subprocess
        from io import BytesIO

        from PIL import Image

        buf = BytesIO()
        Image.fromarray(image).save(buf, format="PNG")
        lang = TESS_LANG.get(language or "en", "eng")
        proc = subprocess.run(["tesseract", "stdin", "stdout", "-l", lang, "--tessdata-dir", TESSDATA, "tsv"],
                              input=buf.getvalue(), capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise BackendError(f"tesseract failed: {proc.stderr.decode(errors='replace')[:200]}")
        rows: dict[tuple[int, int, int], list[tuple[str, float, tuple[float, float, float, float]]]] = {}
        for line in proc.stdout.decode("utf-8", errors="replace").splitlines()[1:]:
            f = line.split("\t")
            if len(f) < 12 or not f[11].strip() or float(f[10]) < 0:
                continue
            x, y, w, h = (float(v) for v in f[6:10])
            word = (f[11], float(f[10]) / 100, (x, y, x + w, y + h))
            rows.setdefault((int(f[2]), int(f[3]), int(f[4])), []).append(word)
        lines = []
        for words in rows.values():
            text = " ".join(w[0] for w in words)
            conf = float(np.mean([w[1] for w in words]))
            box = (min(w[2][0] for w in words), min(w[2][1] for w in words),
                   max(w[2][2] for w in words), max(w[2][3] for w in words))
            lines.append(OCRLine(text=text, confidence=conf, box=box))
        return sort_reading_order(lines)


def sort_reading_order(lines: list[OCRLine]) -> list[OCRLine]:
    """Top-to-bottom, then left-to-right for boxes on the same visual row."""
    if not lines:
        return lines
    heights = [max(1.0, ln.box[3] - ln.box[1]) for ln in lines]
    tol = float(np.median(heights)) * 0.5
    return sorted(lines, key=lambda ln: (round(ln.box[1] / tol) if tol else ln.box[1], ln.box[0]))


def read_size(width: int, height: int, side: int = READ_SIDE) -> tuple[int, int] | None:
    """(width, height) RapidOCR resizes a picture of this size to before reading it (its ``reduce_max_side``, step
    for step: the longer side to ``side``, each side rounded to a multiple of 32); None when it reads the picture as
    it is (the longer side within ``side``, or a size it could not resize)."""
    if max(height, width) <= side:
        return None
    ratio = float(side) / height if height > width else float(side) / width
    new_h, new_w = int(round(int(height * ratio) / 32) * 32), int(round(int(width * ratio) / 32) * 32)
    if new_h <= 0 or new_w <= 0:
        return None
    return new_w, new_h


def as_read(image: np.ndarray) -> np.ndarray:
    """``image`` as RapidOCR reads it: resized as its preprocessing does (the same ``cv2.resize``, bilinear), so
    what it reads from the result is what it would have read from ``image``; ``image`` itself when it is not
    resized."""
    size = read_size(image.shape[1], image.shape[0])
    if size is None:
        return image
    import cv2

    return cv2.resize(image, size)

