"""/v1/glossaries: upload, list, read and delete a key's glossaries (at most ``limits.max_glossaries_per_key``,
each at most ``limits.max_glossary_terms`` terms and ``limits.max_glossary_bytes``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .. import glossary as glossary_mod
from .. import langs
from ..errors import EmptyInput, QuotaExceeded, TooLarge
from ..json_bounds import bounds_of
from ..state.users import glossary_quota_message
from . import spec
from .deps import TranslateKey, context, read_form

router = APIRouter()


@router.post("/v1/glossaries", openapi_extra=spec.body(spec.GLOSSARY))
async def upload_glossary(request: Request, key: TranslateKey) -> JSONResponse:
    ctx = context(request)
    limits = ctx.settings.limits
    if await ctx.offload(ctx.store.count_glossaries, key.key_id) >= limits.max_glossaries_per_key:
        raise QuotaExceeded(glossary_quota_message(limits.max_glossaries_per_key),
                            details={"limit": "max_glossaries_per_key"})  # before reading the body
    form = await read_form(request)
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raw = str(form.get("terms") or "").encode("utf-8")
        filename = ""
    else:
        raw = await upload.read(limits.max_glossary_bytes + 1)
        filename = upload.filename or ""
    if len(raw) > limits.max_glossary_bytes:
        raise TooLarge(f"a glossary is at most {limits.max_glossary_bytes} bytes",
                       details={"limit": "max_glossary_bytes"})
    if not raw.strip():
        raise EmptyInput("send a glossary 'file' (CSV or JSON) or a 'terms' field")
    terms = glossary_mod.parse(raw, max_terms=limits.max_glossary_terms, filename=filename,
                               bounds=bounds_of(ctx.settings))
    src = form.get("source_lang")
    tgt = form.get("target_lang")
    gid = await ctx.offload(ctx.store.put_glossary, key.key_id, str(form.get("name") or filename or "glossary"),
                            terms, langs.normalize(str(src)) if src else None,
                            langs.normalize(str(tgt)) if tgt else None, limit=limits.max_glossaries_per_key)
    return JSONResponse({"glossary_id": gid, "terms": len(terms)}, status_code=201)


@router.get("/v1/glossaries")
async def list_glossaries(request: Request, key: TranslateKey) -> dict[str, object]:
    ctx = context(request)
    return {"glossaries": await ctx.offload(ctx.store.list_glossaries, key.key_id)}


@router.get("/v1/glossaries/{glossary_id}")
async def get_glossary(glossary_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    ctx = context(request)
    meta, terms = await ctx.offload(ctx.store.get_glossary, key.key_id, glossary_id)
    return {**meta, "terms": [{"source": t.source, "target": t.target} for t in terms]}


@router.delete("/v1/glossaries/{glossary_id}")
async def delete_glossary(glossary_id: str, request: Request, key: TranslateKey) -> dict[str, object]:
    ctx = context(request)
    await ctx.offload(ctx.store.delete_glossary, key.key_id, glossary_id)
    return {"glossary_id": glossary_id, "deleted": True}
