"""POST /v1/translate: a file or a text in, JSON (or captions, text, WAV) out."""

from __future__ import annotations

import asyncio
import base64
import functools
import secrets
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .. import glossary as glossary_mod
from ..deadline import Deadline
from ..errors import InvalidParameter
from ..files import FileRequest
from ..files.captions import to_srt, to_vtt
from ..files.output import check_output_format
from ..tracing.http import request_trace
from ..types import TranslationResult
from . import spec
from .deps import TranslateKey, app_state, context, flag, read_form

router = APIRouter()


@router.post("/v1/translate", response_model=None, openapi_extra=spec.body(spec.TRANSLATE))
async def translate(request: Request, key: TranslateKey) -> Response:
    ctx = context(request)
    form = await read_form(request)
    upload = form.get("file")
    data: bytes | None = None
    filename = ""
    if upload is not None and not isinstance(upload, str):
        # a bounded read: one byte over the limit is enough for FileTranslator.validate to answer too_large
        data = await upload.read(ctx.settings.limits.max_upload_bytes + 1)
        filename = upload.filename or ""
    text = form.get("text")
    fmt = str(form.get("output_format") or "json").lower()
    check_output_format(fmt, str(form.get("target_modality") or "text"))
    terms: list[glossary_mod.Term] = []
    if flag(_flag(form.get("enable_glossary", "false"), "enable_glossary")):
        gid = form.get("glossary_id") or await ctx.offload(ctx.store.latest_glossary, key.key_id)
        if not gid:
            raise InvalidParameter("enable_glossary is set but this key has no glossary: upload one first "
                                   "(POST /v1/glossaries) or pass glossary_id", details={"field": "enable_glossary"})
        _meta, terms = await ctx.offload(ctx.store.get_glossary, key.key_id, str(gid))
    signs = None
    if form.get("vocabulary_id"):  # a video's signs, read with this key's sign vocabulary (vision/file_signs.py)
        from ..vision import file_signs

        # on a worker thread: the vocabulary store is disk or network, and the recogniser may be built
        signs = await asyncio.to_thread(file_signs.reader, app_state(request.app).vision, key.key_id,
                                        form.get("vocabulary_id"), secrets.token_hex(6))
    words = flag(_flag(form.get("word_timestamps", "false"), "word_timestamps"))
    source_modality = form.get("source_modality")  # None: FileTranslator.validate tells it from the bytes
    req = FileRequest(source_modality=str(source_modality) if source_modality else None,
                      target_lang=str(form.get("target_lang") or ""),
                      target_modality=str(form.get("target_modality") or "text"),
                      source_lang=str(form.get("source_lang")) if form.get("source_lang") else None,
                      data=data, text=str(text) if text is not None else None, glossary=terms,
                      filename=filename, signs=signs, scope=key.key_id,
                      diarize=flag(_flag(form.get("diarize", "false"), "diarize")),
                      max_speakers=_count(form.get("max_speakers"), "max_speakers"), word_timestamps=words)
    # every check (size, languages and pair, modality vs bytes, UTF-8): before the queue, before any decoding
    # (on a thread: telling an ogg / webm / mp4 from its header whether it holds video opens the container)
    valid = await asyncio.to_thread(ctx.translator.validate, req)
    # the time limit covers the wait for a slot and the work; the work checks it as it goes (a thread cannot be
    # cancelled: it stops itself at its next stage or MT chunk with 504 instead of answering 200 late)
    deadline = Deadline(ctx.settings.server.request_timeout_s)
    result = await ctx.admission.run(key.key_id, deadline,
                                     functools.partial(ctx.translator.translate, valid, deadline=deadline,
                                                       trace=request_trace(request, key_id=key.key_id)))
    return _render(result, fmt, karaoke=words)


def _render(result: TranslationResult, fmt: str, *, karaoke: bool = False) -> Response:
    if fmt == "srt":
        return PlainTextResponse(to_srt(result.segments, result.slides), media_type="application/x-subrip")
    if fmt == "vtt":  # with word times: the spoken words' karaoke line over the translation (files/captions.py)
        return PlainTextResponse(to_vtt(result.segments, result.slides, karaoke=karaoke), media_type="text/vtt")
    if fmt == "text":
        return PlainTextResponse(result.braille if result.braille is not None else result.text)
    if result.audio is not None and fmt == "wav":
        return Response(result.audio, media_type="audio/wav",
                        headers={"X-LinguaFusion-Text": quote(result.text[:2000])})
    body = result.to_json_dict()
    if result.audio is not None:
        body["audio_base64"] = base64.b64encode(result.audio).decode("ascii")
    return JSONResponse(body)


FLAGS = ("true", "false", "1", "0", "yes", "no", "on", "off")


def _flag(value: object, field: str) -> object:
    """A yes/no form field as the spec declares it: a typo ("ture") is refused, not read as "no"."""
    if str(value).strip().lower() not in FLAGS:
        raise InvalidParameter(f"{field} must be true or false", details={"field": field})
    return value


def _count(value: object, field: str) -> int | None:
    """An optional whole-number form field ("3"); anything else is refused (its range: files/validate.py)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidParameter(f"{field} must be a whole number", details={"field": field}) from None
