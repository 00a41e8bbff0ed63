"""Pieces the HTTP and in-process clients share: input reading, modality inference, result parsing."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from ..errors import BackendError, EmptyInput, InvalidParameter, LinguaFusionError, from_code
from ..json_types import JSONObject
from ..types import TranslationResult

MediaInput = str | os.PathLike[str] | bytes


def read_file(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """A client-side file's bytes; a missing or unreadable file is an ``invalid_parameter`` like any bad input."""
    p = Path(path)
    if not p.exists():
        raise InvalidParameter(f"no such {what}: {p}", details={"path": str(p)})
    if not p.is_file():
        raise InvalidParameter(f"{p} is not a file", details={"path": str(p)})
    try:
        return p.read_bytes()
    except OSError as exc:
        raise InvalidParameter(f"cannot read {p}: {exc.strerror or exc}", details={"path": str(p)}) from exc


def read_input(input_media: MediaInput | None, text: str | None, source_modality: str | None
               ) -> tuple[bytes | None, str | None, str | None, str]:
    """Return (data, text, source_modality, filename). The modality is the caller's, or None: then the bytes tell
    it (FileTranslator.validate, here or on the server), never the file name, so a WAV named .png is a WAV and a
    .webm that holds only audio is audio."""
    if text is not None and input_media is not None:
        raise InvalidParameter("pass input_media or text, not both", details={"field": "text"})
    if text is not None:
        return None, text, source_modality or "text", ""
    if input_media is None:
        raise EmptyInput("pass input_media (a path or bytes) or text")
    if isinstance(input_media, bytes):
        return input_media, None, source_modality, "upload"
    path = Path(input_media)
    return read_file(path), None, source_modality, path.name


def parse_result(body: JSONObject) -> TranslationResult:
    audio_b64 = body.pop("audio_base64", None)
    try:
        result = TranslationResult.model_validate(body)
    except ValidationError as exc:  # a 200 from something that is not a LinguaFusion server
        raise BackendError(f"the server's answer is not a translation result ({exc.error_count()} fields wrong); "
                           "is the URL a LinguaFusion server?", details={"fields": sorted(body)[:20]}) from exc
    if audio_b64:
        result.audio = base64.b64decode(str(audio_b64))
    return result


def error_of(err: Mapping[str, object], message: str, *, status: int | None = None,
             retry_after: float | None = None) -> LinguaFusionError:
    """The typed error a server's error object names (``code``, ``message``, ``details``); ``message`` when it
    gives none."""
    details = err.get("details")
    return from_code(str(err.get("code", "internal")), str(err.get("message", message)), status=status,
                     details=dict(details) if isinstance(details, dict) else None, retry_after=retry_after)


def raise_for_error(status: int, body: object, headers: Mapping[str, str] | None = None) -> None:
    if status < 400:
        return
    err: object = body.get("error", {}) if isinstance(body, dict) else {}
    if not isinstance(err, dict):  # an error body of another program: {"error": "text"}
        err = {"message": f"HTTP {status}: {str(err)[:200]}"}
    retry = None
    if headers is not None and headers.get("retry-after"):
        try:
            retry = float(headers["retry-after"])
        except ValueError:
            retry = None
    raise error_of(err, f"HTTP {status}", status=status, retry_after=retry)
