"""Images -> RGB uint8 arrays through Pillow, with the pixel limit checked from the header before decoding."""

from __future__ import annotations

import io
import warnings

import numpy as np

from ..config import LimitSettings
from ..errors import CorruptMedia, TooLarge, UnsupportedMedia


def image_pixels(data: bytes) -> int:
    """Width x height from the image's header, nothing decoded (0 when the header cannot be read: decoding then
    says why). What a picture costs, paid before the work (stream/budget.py)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w, h = Image.open(io.BytesIO(data)).size
    except Exception:  # any failure to read a header: decode_image gives the typed error
        return 0
    return int(w) * int(h)


def decode_image(data: bytes, limits: LimitSettings) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))  # reads the header only
            w, h = img.size
            if w * h > limits.max_image_pixels or max(w, h) > limits.max_image_side:
                raise TooLarge(f"image is {w}x{h}; the limit is {limits.max_image_pixels} pixels "
                               f"and {limits.max_image_side} per side", details={"limit": "max_image_pixels"})
            if img.format not in {"PNG", "JPEG", "WEBP"}:
                raise UnsupportedMedia(f"image format {img.format} is not supported (png, jpeg, webp)")
            img.load()
            rgb = img.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge("image exceeds the decompression limit", details={"limit": "max_image_pixels"}) from exc
    except UnidentifiedImageError as exc:
        raise CorruptMedia("cannot identify the image: corrupt or not an image") from exc
    except (OSError, SyntaxError, ValueError) as exc:  # PIL raises these for truncated / broken data
        raise CorruptMedia(f"cannot decode the image: corrupt or truncated ({exc})") from exc
    if rgb.width < 4 or rgb.height < 4:
        raise CorruptMedia("image is too small to hold text")
    return np.asarray(rgb)
