"""Pictures cross to the model process at the size OCR reads them (serving/shard/pictures.py): the resize is
RapidOCR's own preprocessing step for step, so what it reads is the same; a 40 MP picture crosses as 1984x1984.
Real RapidOCR and a real model process's socket; no server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import FONT
from test_sharding import _ctx, _one_worker

from lingua_fusion.models.ocr import READ_SIDE, RapidOCRBackend, as_read, read_size
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.shard import codec, pictures


@pytest.mark.parametrize("width,height", [(6300, 6300), (4000, 3000), (3000, 4000), (2001, 600), (7000, 2100),
                                          (2000, 2000), (1920, 1080), (5000, 40)])
def test_the_resize_is_rapidocrs_own_preprocessing(width: int, height: int) -> None:
    from rapidocr.utils.process_img import resize_image_within_bounds

    image = np.random.default_rng(width + height).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ours = as_read(image)
    if read_size(width, height) is None:
        assert ours is image  # read as it is: crosses as it is
        return
    theirs, _, _ = resize_image_within_bounds(image, 30, READ_SIDE)
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs)
    again, ratio_h, ratio_w = resize_image_within_bounds(ours, 30, READ_SIDE)
    assert again is ours or np.array_equal(again, ours)  # RapidOCR then reads it as it is
    assert (ratio_h, ratio_w) == (1.0, 1.0)


def slide(width: int, height: int) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    title, body = ImageFont.truetype(FONT, height // 12), ImageFont.truetype(FONT, height // 22)
    draw.text((width // 12, height // 10), "Quarterly Results 2026", fill="black", font=title)
    for i, line in enumerate(["Revenue grew in every region", "The new library ships in May",
                              "Questions at the end of the talk"]):
        draw.text((width // 10, height // 3 + i * height // 7), line, fill="black", font=body)
    return np.asarray(img)


@pytest.mark.parametrize("width,height", [(4000, 2250), (2600, 3400)])
def test_a_large_slide_reads_the_same_whole_and_at_the_size_ocr_reads(width: int, height: int) -> None:
    ocr = RapidOCRBackend()
    image = slide(width, height)
    whole = ocr.recognize(image)
    small = as_read(image)
    assert max(small.shape[:2]) <= READ_SIDE < max(image.shape[:2])
    read = pictures.scaled(ocr.recognize(small), (width / small.shape[1], height / small.shape[0]))
    assert read is not None
    assert [ln.text for ln in read] == [ln.text for ln in whole] and len(whole) == 4, [ln.text for ln in whole]
    assert [ln.confidence for ln in read] == pytest.approx([ln.confidence for ln in whole], abs=1e-6)
    for a, b in zip(read, whole, strict=True):
        assert a.box == pytest.approx(b.box, abs=1.0)  # the client's pixels, as RapidOCR maps them itself


async def test_a_40_megapixel_picture_crosses_as_what_ocr_reads(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a 16 MiB frame bound a 6300x6300 picture (119 MB of RGB) could not cross at all; at the size OCR reads
    it (1984x1984, 11.8 MB) it does, and the model process reads it."""
    server, listener, link, port = await _one_worker(tmp_path)
    monkeypatch.setattr(codec, "MAX_FRAME", 16 * 1024 * 1024)
    sent: list[int] = []
    put = codec.Outbox.put

    def counting(self: codec.Outbox, msg: dict[str, object], **kwargs: bool) -> list[int]:
        payload = msg.get("payload")
        if isinstance(payload, np.ndarray):
            sent.append(payload.nbytes)
        return put(self, msg, **kwargs)

    monkeypatch.setattr(codec.Outbox, "put", counting)
    try:
        blank = np.full((6300, 6300, 3), 255, dtype=np.uint8)
        assert await port.run(ModelKey.ocr(), blank, _ctx("s1")) == []
        assert sent == [1984 * 1984 * 3]
        small = slide(1920, 1080)  # within what OCR reads: crosses as it is
        lines = await port.run(ModelKey.ocr(), small, _ctx("s1"))
        assert sent[-1] == small.nbytes and "Quarterly Results 2026" in [ln.text for ln in lines]
    finally:
        await link.close()
        listener.close()
        await server.close()
