"""/v1/vocabularies: a key's taught vocabularies of signs and lip words (docs/video.md "Sign and lips").

- ``POST /v1/vocabularies``: JSON ``{"name", "kind": "sign" or "lip", "lang"}`` -> 201, the vocabulary
- ``GET /v1/vocabularies``; ``GET`` / ``DELETE /v1/vocabularies/{id}``: the key's vocabularies; one with its examples
- ``POST /v1/vocabularies/{id}/examples``: JSON ``{"gloss", "frames": [...]}`` (landmarks) or multipart ``gloss`` +
  ``file`` (a short video: the server reads its landmarks) -> 201; ``DELETE .../examples/{example_id}``
- ``GET /v1/vocabularies/{id}/export``, ``POST /v1/vocabularies/import``: the whole vocabulary as JSON, and back (a
  new vocabulary of the importing key)
- ``POST /v1/vocabularies/{id}/recognise``: JSON ``{"frames", "target_lang"}`` or multipart ``file`` +
  ``target_lang``: the glosses on a timeline, each translated

Every route is scoped to the calling key: another key's vocabulary id is a 404, as if it did not exist.
Video and recognition work runs on a worker thread within the key's fair share of file slots (``Admission``).
A JSON body is parsed once, on a worker thread (``vision.bigjson``: in a way that lets the event loop run), and the
landmarks' checking, the store's writes and the export's encoding run on worker threads too: a client sending the
largest allowed body does not hold up other clients' requests (``bench/vocab_loop.py``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .. import langs
from ..config import Settings
from ..deadline import Deadline
from ..errors import EmptyInput, InvalidParameter, TooLarge
from ..files import FileRequest
from ..json_bounds import landmark_bounds
from ..json_types import JSONObject
from ..vision import bigjson
from ..vision.landmarks import LandmarkSeq
from ..vision.service import VisionService, recognition_body
from ..vision.vocab_model import check_gloss, check_kind
from ..vision.vocab_port import open_vocabularies
from . import spec
from .deps import TranslateKey, app_state, check_json_type, context, is_json, parse_json, read_form

router = APIRouter()
POINTS: JSONObject = {"type": "array",
                      "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}}
FRAMES: JSONObject = {"type": "array", "description": "landmark frames, t non-decreasing (docs/video.md)", "items": {
    "type": "object", "properties": {"t": {"type": "number"}, "left_hand": POINTS, "right_hand": POINTS,
                                     "pose": POINTS, "lips": POINTS}}}
CREATE = spec.json_body({"type": "object", "required": ["kind"], "additionalProperties": False, "properties": {
    "name": {"type": "string"}, "kind": {"enum": ["sign", "lip"]},
    "lang": {"type": "string", "description": "the language the glosses are written in (default en)"}}})
EXAMPLE: JSONObject = {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "required": ["gloss", "frames"], "additionalProperties": False,
                                    "properties": {"gloss": {"type": "string"}, "frames": FRAMES}}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["gloss", "file"], "properties": {
        "gloss": {"type": "string"}, "file": {"type": "string", "format": "binary", "description": "a video"}}}}}}
RECOGNISE: JSONObject = {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "required": ["frames"], "additionalProperties": False,
                                    "properties": {"frames": FRAMES, "target_lang": {"type": "string"}}}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"}, "target_lang": {"type": "string"}}}}}}
IMPORT = spec.json_body({"type": "object", "required": ["format", "kind", "examples"], "additionalProperties": False,
                         "properties": {
    "format": {"const": "linguafusion-vocabulary/1"}, "name": {"type": "string"}, "kind": {"enum": ["sign", "lip"]},
    "lang": {"type": "string"}, "examples": {"type": "array", "items": {
        "type": "object", "required": ["gloss", "frames"],
        "properties": {"gloss": {"type": "string"}, "frames": FRAMES}}}}})

CREATE_FIELDS = frozenset({"name", "kind", "lang"})
EXAMPLE_FIELDS = frozenset({"gloss", "frames"})
RECOGNISE_FIELDS = frozenset({"frames", "target_lang"})
IMPORT_FIELDS = frozenset({"format", "name", "kind", "lang", "examples"})


def install(app: FastAPI, settings: Settings) -> VisionService:
    """The vocabulary store and the vision service on ``app.state.vision``, and the routes."""
    service = VisionService(settings, open_vocabularies(settings))  # SQLite, or Redis with state.redis_url
    app_state(app).vision = service
    app.include_router(router)
    return service


def close(app: FastAPI) -> None:
    service = app_state(app).vision
    service.close()
    service.store.close()


def _text(body: Mapping[str, object], field: str) -> str:
    value = body.get(field)
    if field in body and not isinstance(value, str):  # an explicit null too: the schema says string
        raise InvalidParameter(f"'{field}' must be a string", details={"field": field})
    return value if isinstance(value, str) else ""


def _vision(request: Request) -> VisionService:
    return app_state(request.app).vision


async def _json(request: Request) -> object:
    """The JSON body, parsed once and strictly (as ``deps.require_json``), on a worker thread."""
    check_json_type(request)
    bounds = landmark_bounds(_vision(request).settings)
    return await asyncio.to_thread(parse_json, await request.body(), bounds, bigjson.loads)


def closed(body: object, fields: frozenset[str], what: str) -> dict[str, object]:
    """``body`` as a JSON object of only ``fields`` (the route's schema is closed: a field it does not know is a
    mistake or junk, refused rather than ignored)."""
    if not isinstance(body, dict):
        raise InvalidParameter(f"the body must be a JSON object {what}")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise InvalidParameter(f"unknown field(s) {', '.join(map(repr, unknown[:5]))}: the body is {what}",
                               details={"field": unknown[0]})
    return body


async def _payload(request: Request, fields: frozenset[str], what: str) -> tuple[dict[str, object], bytes | None]:
    """A JSON object body of only ``fields``, or a multipart form's fields and its ``file``'s bytes."""
    if is_json(request):
        return closed(await _json(request), fields, what), None
    form = await read_form(request)
    values: dict[str, object] = {k: v for k, v in form.items() if isinstance(v, str)}
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise EmptyInput("send JSON landmarks ({\"frames\": [...]}) or a multipart 'file' (a short video)")
    limit = _vision(request).settings.vision.max_vocabulary_bytes
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"a video sent here is at most {limit} bytes", details={"limit": "max_vocabulary_bytes"})
    if not data:
        raise EmptyInput("the uploaded file is empty")
    return values, data


async def _sequence(request: Request, key_id: str, kind: str, body: Mapping[str, object], data: bytes | None,
                    deadline: Deadline) -> LandmarkSeq:
    if data is None:
        return await asyncio.to_thread(LandmarkSeq.from_json, body.get("frames"))
    service = _vision(request)
    return await context(request).admission.run(
        key_id, deadline, functools.partial(service.landmarks_from_video, data, kind, deadline))


@router.post("/v1/vocabularies", openapi_extra=spec.body(CREATE))
async def create_vocabulary(request: Request, key: TranslateKey) -> JSONResponse:
    body = closed(await _json(request), CREATE_FIELDS, "{name, kind, lang}")
    name, kind = _text(body, "name"), check_kind(body.get("kind"))
    lang = langs.normalize(_text(body, "lang") or "en", field="lang")
    vocab = await asyncio.to_thread(_vision(request).store.create, key.key_id, name, kind, lang)
    return JSONResponse(vocab.to_dict(), status_code=201)


@router.get("/v1/vocabularies")
async def list_vocabularies(request: Request, key: TranslateKey) -> dict[str, object]:
    vocabs = await asyncio.to_thread(_vision(request).store.list, key.key_id)
    return {"vocabularies": [v.to_dict() for v in vocabs]}


@router.get("/v1/vocabularies/{vocab_id}")
async def get_vocabulary(vocab_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    store = _vision(request).store
    vocab = await asyncio.to_thread(store.get, key.key_id, vocab_id)
    return {**vocab.to_dict(), "examples": await asyncio.to_thread(store.examples, key.key_id, vocab_id)}


@router.delete("/v1/vocabularies/{vocab_id}")
async def delete_vocabulary(vocab_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    await asyncio.to_thread(_vision(request).store.delete, key.key_id, vocab_id)
    return {"vocabulary_id": vocab_id, "deleted": True}


@router.post("/v1/vocabularies/{vocab_id}/examples", openapi_extra=spec.body(EXAMPLE))
async def add_example(vocab_id: str, request: Request, key: TranslateKey) -> JSONResponse:
    store = _vision(request).store
    vocab = await asyncio.to_thread(store.get, key.key_id, vocab_id)  # 404 before reading a video for nothing
    body, data = await _payload(request, EXAMPLE_FIELDS, "{gloss, frames}")
    gloss = check_gloss(body.get("gloss"))
    deadline = Deadline(context(request).settings.server.request_timeout_s)
    seq = await _sequence(request, key.key_id, vocab.kind, body, data, deadline)
    example = await asyncio.to_thread(store.add_example, key.key_id, vocab_id, gloss, seq)
    return JSONResponse({"vocabulary_id": vocab_id, **example}, status_code=201)


@router.delete("/v1/vocabularies/{vocab_id}/examples/{example_id}")
async def delete_example(vocab_id: str, example_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    await asyncio.to_thread(_vision(request).store.delete_example, key.key_id, vocab_id, example_id)
    return {"vocabulary_id": vocab_id, "example_id": example_id, "deleted": True}


@router.get("/v1/vocabularies/{vocab_id}/export")
async def export_vocabulary(vocab_id: str, request: Request, key: TranslateKey) -> Response:
    body = await asyncio.to_thread(_vision(request).store.export_json, key.key_id, vocab_id)
    return Response(body, media_type="application/json")


@router.post("/v1/vocabularies/import", openapi_extra=spec.body(IMPORT))
async def import_vocabulary(request: Request, key: TranslateKey) -> JSONResponse:
    doc = closed(await _json(request), IMPORT_FIELDS, "a vocabulary export {format, name, kind, lang, examples}")
    name = request.query_params.get("name")
    ctx = context(request)  # every example is checked (its features computed): work in the key's share of slots
    vocab = await ctx.admission.run(key.key_id, Deadline(ctx.settings.server.request_timeout_s),
                                    functools.partial(_vision(request).store.import_, key.key_id, doc, name))
    return JSONResponse(vocab.to_dict(), status_code=201)


@router.post("/v1/vocabularies/{vocab_id}/recognise", openapi_extra=spec.body(RECOGNISE))
async def recognise(vocab_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    ctx = context(request)
    service = _vision(request)
    vocab = await asyncio.to_thread(service.store.get, key.key_id, vocab_id)
    body, data = await _payload(request, RECOGNISE_FIELDS, "{frames, target_lang}")
    target = body.get("target_lang")
    if target is not None and not isinstance(target, str):
        raise InvalidParameter("'target_lang' must be a language code", details={"field": "target_lang"})
    deadline = Deadline(ctx.settings.server.request_timeout_s)
    translate = None
    if target:
        def translate(text: str) -> str:  # recognised glosses go through MT like any source text
            req = FileRequest(source_modality="text", target_lang=target, source_lang=vocab.lang, text=text,
                              scope=key.key_id)  # this key's translation memory (tm/key.py)
            return ctx.translator.translate(req, deadline=deadline).text

        # a bad target language or pair is refused before any work
        ctx.translator.validate(FileRequest(source_modality="text", target_lang=target, source_lang=vocab.lang,
                                            text="test"))
    seq = await _sequence(request, key.key_id, vocab.kind, body, data, deadline)
    spans = await ctx.admission.run(key.key_id, deadline,
                                    functools.partial(service.recognise, key.key_id, vocab_id, seq, translate))
    return dict(recognition_body(vocab_id, vocab.kind, len(seq), spans, bool(target)))
