"""OpenAI's audio API on the file path: ``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations``.

Both read OpenAI's multipart fields, build one ``FileRequest`` and run it through the FileTranslator like
POST /v1/translate does (validate before the queue, the same admission and deadline), then answer in OpenAI's
shapes: json, text, srt, vtt, verbose_json, or server-sent events with ``stream=true``. A transcription is the
speech in its own language (``FileRequest.transcribe_only``: no MT); a translation goes to English, or to
``target_language`` (our extension), through the MT route /v1/translate would take (or Whisper's speech -> English
task where no MT pair exists). ``glossary_id`` (extension) applies a glossary: ASR hot words and MT terms.

Keys are checked by the same dependency as every route (``Authorization: Bearer``); errors are answered in OpenAI's
shape (openai_compat.py). Fields and their support: docs/openai.md.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TypedDict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.datastructures import FormData, UploadFile

from .. import glossary as glossary_mod
from ..deadline import Deadline
from ..errors import EmptyInput, InvalidParameter, LinguaFusionError
from ..files import FileRequest
from ..files.captions import to_srt, to_vtt
from ..tracing.http import request_trace
from ..types import TranslationResult
from .deps import AppContext, TranslateKey, app_state, context, flag, read_form
from .errors import retry_headers
from .openai_compat import language_code, language_name, openai_error, speech_model

log = logging.getLogger("lingua_fusion.api")
FORMATS = ("json", "text", "srt", "verbose_json", "vtt", "diarized_json")
DIARIZED_FORMATS = ("json", "text", "diarized_json")  # what OpenAI's diarizing model answers in
GRANULARITIES = ("segment", "word")


class OpenAIRoute(APIRoute):
    """A route whose errors (its auth dependency's included) are answered in OpenAI's error shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[object, None, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except LinguaFusionError as exc:
                return error_response(request, exc)

        return route


def error_response(request: Request, exc: LinguaFusionError) -> JSONResponse:
    app_state(request.app).metrics.errors.labels(code=exc.code).inc()
    if exc.status >= 500:
        log.error("request failed: %s", exc.message)
    return JSONResponse({"error": openai_error(exc)}, status_code=exc.status, headers=retry_headers(exc))


router = APIRouter(route_class=OpenAIRoute)


@router.post("/v1/audio/transcriptions", response_model=None, include_in_schema=False)
async def transcriptions(request: Request, key: TranslateKey) -> Response:
    form = await read_form(request)
    if form.get("target_language"):
        raise InvalidParameter("a transcription stays in the spoken language: for another language use "
                               "/v1/audio/translations with target_language", details={"field": "target_language"})
    return await _run(request, key.key_id, form, translate=False)


@router.post("/v1/audio/translations", response_model=None, include_in_schema=False)
async def translations(request: Request, key: TranslateKey) -> Response:
    return await _run(request, key.key_id, await read_form(request), translate=True)


async def _run(request: Request, key_id: str, form: FormData, *, translate: bool) -> Response:
    ctx = context(request)
    model = speech_model(_text(form, "model"))
    fmt = (_text(form, "response_format") or "json").lower()
    if fmt not in FORMATS:
        raise InvalidParameter(f"response_format must be one of {', '.join(FORMATS)}",
                               details={"field": "response_format"})
    if fmt == "diarized_json" and not model.diarize:
        raise InvalidParameter("response_format diarized_json needs model gpt-4o-transcribe-diarize",
                               details={"field": "response_format"})
    if model.diarize and fmt not in DIARIZED_FORMATS:
        raise InvalidParameter(f"{model.name} answers in {', '.join(DIARIZED_FORMATS)}",
                               details={"field": "response_format"})
    _temperature(form)
    stream = flag(_text(form, "stream") or "false")
    granularities = _granularities(form, fmt, translate=translate, stream=stream)
    data, filename = await _file(form, ctx)
    source = model.language(language_code(_language(form), field="language"))
    target = language_code(_text(form, "target_language"), field="target_language") or "en"
    # the audio track of any audio or video file (a video's frames are not read: OpenAI's API is speech only)
    req = FileRequest(source_modality="audio", target_lang=target if translate else "", source_lang=source,
                      data=data, glossary=await _glossary(form, ctx, key_id), filename=filename, prompt=_prompt(form),
                      transcribe_only=not translate, scope=key_id, diarize=model.diarize,
                      word_timestamps="word" in granularities)
    valid = ctx.translator.validate(req)  # every check before the queue and before any decoding
    deadline = Deadline(ctx.settings.server.request_timeout_s)
    result = await ctx.admission.run(key_id, deadline,
                                     functools.partial(ctx.translator.translate, valid, deadline=deadline,
                                                       trace=request_trace(request, key_id=key_id)))
    if stream:
        return StreamingResponse(_events(result), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return render(result, fmt, task="translate" if translate else "transcribe", granularities=granularities)


# ---- reading the form ---------------------------------------------------------------------------------------
def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidParameter(f"{name} must be a form field, not a file", details={"field": name})
    return value.strip() or None


async def _file(form: FormData, ctx: AppContext) -> tuple[bytes, str]:
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise EmptyInput("send the audio as the 'file' part (multipart/form-data)", details={"field": "file"})
    assert isinstance(upload, UploadFile)
    # a bounded read: one byte over the limit is enough for FileTranslator.validate to answer too_large
    data = await upload.read(ctx.settings.limits.max_upload_bytes + 1)
    if not data:
        raise EmptyInput("the file is empty", details={"field": "file"})
    return data, upload.filename or ""


def _granularities(form: FormData, fmt: str, *, translate: bool, stream: bool) -> tuple[str, ...]:
    """``timestamp_granularities[]`` as OpenAI reads it: segment and/or word, word only with verbose_json (json
    with word is OpenAI's 400 too), and only on a transcription (OpenAI's translations have no such field; here
    the words are the spoken language's, which a translation's text is not)."""
    raw = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    if any(g not in GRANULARITIES for g in raw):
        raise InvalidParameter("timestamp_granularities[] takes segment and word",
                               details={"field": "timestamp_granularities[]"})
    chosen = tuple(g for g in GRANULARITIES if g in raw)
    if "word" not in chosen:
        return chosen
    if translate:
        raise InvalidParameter("word timestamps are of the spoken words: ask /v1/audio/transcriptions",
                               details={"field": "timestamp_granularities[]"})
    if fmt != "verbose_json" or stream:
        raise InvalidParameter("timestamp_granularities[]=word needs response_format=verbose_json (not a stream)",
                               details={"field": "timestamp_granularities[]"})
    return chosen


def _language(form: FormData) -> str | None:
    """``language``, or ``languages[]`` when it names one language (several: detected, as when none is given)."""
    one = _text(form, "language")
    if one:
        return one
    many = [v for v in form.getlist("languages[]") if isinstance(v, str) and v.strip()]
    return many[0] if len(many) == 1 else None


def _temperature(form: FormData) -> None:
    """Checked as OpenAI checks it; decoding here is greedy at temperature 0 whatever is asked (no fallback)."""
    raw = _text(form, "temperature")
    if raw is None:
        return
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise InvalidParameter("temperature must be a number from 0 to 1", details={"field": "temperature"})


def _prompt(form: FormData) -> str | None:
    """Whisper's initial prompt: ``prompt``, then ``keywords[]`` (words to expect)."""
    keywords = [v.strip() for v in form.getlist("keywords[]") if isinstance(v, str) and v.strip()]
    parts = [p for p in (_text(form, "prompt"), ", ".join(keywords)) if p]
    return " ".join(parts)[:1000] or None


async def _glossary(form: FormData, ctx: AppContext, key_id: str) -> list[glossary_mod.Term]:
    gid = _text(form, "glossary_id")
    if gid is None:
        return []
    return (await ctx.offload(ctx.store.get_glossary, key_id, gid))[1]


# ---- answering ----------------------------------------------------------------------------------------------
def render(result: TranslationResult, fmt: str, *, task: str, granularities: tuple[str, ...] = ()) -> Response:
    """``granularities`` shape verbose_json as OpenAI does: ``segments`` unless only words were asked for,
    ``words`` (a flat list, in order) when they were."""
    text = result.text if task == "translate" else result.source_text
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt == "srt":
        return PlainTextResponse(to_srt(result.segments))
    if fmt == "vtt":
        return PlainTextResponse(to_vtt(result.segments), media_type="text/vtt")
    body: dict[str, object] = {"text": text}
    if fmt == "diarized_json":
        body = {"task": "transcribe", "duration": result.duration_s or 0.0, "text": text,
                "segments": diarized_segments(result, task)}
    if fmt == "verbose_json":
        lang = result.target_lang if task == "translate" else result.source_lang
        body = {"task": task, "language": language_name(lang), "duration": result.duration_s or 0.0, "text": text}
        if granularities != ("word",):
            body["segments"] = segments(result)
        if "word" in granularities:
            body["words"] = words(result)
    body["usage"] = {"type": "duration", "seconds": round(result.duration_s or 0.0, 3)}
    body["linguafusion"] = extension(result)
    return JSONResponse(body)


class Segment(TypedDict):
    """OpenAI's ``TranscriptionSegment`` (verbose_json)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class DiarizedSegment(TypedDict):
    """OpenAI's ``TranscriptionDiarizedSegment`` (diarized_json)."""

    type: str
    id: str
    start: float
    end: float
    text: str
    speaker: str


class Word(TypedDict):
    """OpenAI's ``TranscriptionWord`` (verbose_json with word granularity)."""

    word: str
    start: float
    end: float


def segments(result: TranslationResult) -> list[Segment]:
    """OpenAI's segment objects. What Whisper reports here is one confidence per segment (exp(avg_logprob) times
    1 - no_speech_prob): ``avg_logprob`` is its log, ``no_speech_prob`` 0, ``tokens`` empty (docs/openai.md)."""
    out: list[Segment] = []
    for i, s in enumerate(result.segments):
        raw = s.text.encode("utf-8")
        out.append({"id": i, "seek": int(round(s.start * 100)), "start": s.start, "end": s.end, "text": s.text,
                    "tokens": [], "temperature": 0.0,
                    "avg_logprob": round(math.log(max(s.confidence or 0.0, 1e-6)), 4),
                    "compression_ratio": round(len(raw) / max(1, len(zlib.compress(raw))), 4),
                    "no_speech_prob": 0.0})
    return out


def diarized_segments(result: TranslationResult, task: str) -> list[DiarizedSegment]:
    """OpenAI's diarized segments (``TranscriptionDiarizedSegment``): speakers named as OpenAI names them, "A",
    "B", ... in order of appearance (ours are S1, S2, ...; ``linguafusion.speakers`` maps one to the other)."""
    return [{"type": "transcript.text.segment", "id": f"seg_{i}", "start": s.start, "end": s.end,
             "text": s.text if task == "translate" else s.source_text, "speaker": openai_speaker(s.speaker)}
            for i, s in enumerate(result.segments)]


def openai_speaker(label: str | None) -> str:
    """S1 -> A, S2 -> B, ... S27 -> AA; no speaker (a segment with no voice) -> "unknown"."""
    if not label or not label[1:].isdigit():
        return "unknown"
    n, out = int(label[1:]), ""
    while n > 0:
        n, r = divmod(n - 1, 26)
        out = chr(ord("A") + r) + out
    return out


def words(result: TranslationResult) -> list[Word]:
    """OpenAI's word objects, ``{word, start, end}``, every segment's in order (the probability stays on
    /v1/translate's ``segments[].words``: OpenAI's shape has none)."""
    return [{"word": w.word, "start": w.start, "end": w.end} for s in result.segments for w in s.words or ()]


def extension(result: TranslationResult) -> dict[str, object]:
    """What only this server says about a result (ignored by OpenAI's clients): languages, the route, warnings."""
    out: dict[str, object] = {"source_lang": result.source_lang, "target_lang": result.target_lang,
                              "source_text": result.source_text, "route": result.route,
                              "quality": result.quality, "low_confidence": result.low_confidence,
                              "models": result.models, "warnings": result.warnings}
    if result.glossary_terms_applied:
        out["glossary_terms_applied"] = result.glossary_terms_applied
    speakers = sorted({s.speaker for s in result.segments if s.speaker}, key=lambda x: int(x[1:]))
    if speakers:
        out["speakers"] = {openai_speaker(s): s for s in speakers}
    return out


async def _events(result: TranslationResult) -> AsyncIterator[str]:
    """OpenAI's transcription stream: one ``transcript.text.delta`` per segment (the file is transcribed whole
    first: the file path is not incremental), then ``transcript.text.done``. The deltas add up to the text."""
    text = ""
    for s in result.segments:
        delta = s.text if not text else " " + s.text
        text += delta
        yield _sse({"type": "transcript.text.delta", "delta": delta})
    yield _sse({"type": "transcript.text.done", "text": text})


def _sse(event: dict[str, str]) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
