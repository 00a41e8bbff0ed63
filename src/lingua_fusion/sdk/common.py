"""Pieces the HTTP and in-process clients share: input reading, modality inference, result parsing."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from ..errors import EmptyInput, InvalidParameter, from_code
from ..types import TranslationResult

EXT_MODALITY = {
    ".wav": "audio", ".mp3": "audio", ".m4a": "audio", ".aac": "audio", ".ogg": "audio", ".opus": "audio",
    ".oga": "audio", ".flac": "audio", ".weba": "audio", ".webm": "video", ".mp4": "video", ".mov": "video",
    ".mkv": "video", ".png": "image", ".jpg": "image", ".jpeg": "image", ".webp": "image", ".txt": "text",
}
MediaInput = str | os.PathLike[str] | bytes


def read_input(input_media: MediaInput | None, text: str | None, source_modality: str | None, *,
               decode_text: bool = True) -> tuple[bytes | None, str | None, str, str]:
    """Return (data, text, source_modality, filename). With ``decode_text=False`` a text file comes back as
    bytes, for FileTranslator.validate to check (UTF-8, size) like an uploaded one."""
    if text is not None:
        return None, text, source_modality or "text", ""
    if input_media is None:
        raise EmptyInput("pass input_media (a path or bytes) or text")
    if isinstance(input_media, bytes):
        if source_modality is None:
            raise InvalidParameter("source_modality is required when input_media is bytes")
        return input_media, None, source_modality, "upload"
    path = Path(input_media)
    if not path.is_file():
        raise InvalidParameter(f"no such file: {path}")
    modality = source_modality or EXT_MODALITY.get(path.suffix.lower())
    if modality is None:
        raise InvalidParameter(f"cannot tell the modality of {path.name}; pass source_modality")
    if modality == "text" and decode_text:
        return None, path.read_text(encoding="utf-8"), "text", path.name
    return path.read_bytes(), None, modality, path.name


def parse_result(body: dict[str, Any]) -> TranslationResult:
    audio_b64 = body.pop("audio_base64", None)
    result = TranslationResult.model_validate(body)
    if audio_b64:
        result.audio = base64.b64decode(audio_b64)
    return result


def raise_for_error(status: int, body: Any, headers: Any = None) -> None:
    if status < 400:
        return
    err = body.get("error", {}) if isinstance(body, dict) else {}
    retry = None
    if headers is not None and headers.get("retry-after"):
        try:
            retry = float(headers["retry-after"])
        except ValueError:
            retry = None
    raise from_code(err.get("code", "internal"), err.get("message", f"HTTP {status}"), status=status,
                    details=err.get("details"), retry_after=retry)
