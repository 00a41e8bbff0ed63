"""HTTP clients. Both raise the typed errors of ``lingua_fusion.errors`` carrying the server's error code."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

import httpx

from ..errors import BackendError, InvalidParameter, LinguaFusionError, RequestTimeout
from ..json_types import JSONObject, JSONValue
from ..rooms.model import RoomJSON, TokenJSON
from ..types import TranslationResult
from ..vision.client import AsyncVocabularyMethods, RequestArgs, VocabularyMethods
from .answers import (
    ModelsJSON,
    RoomCreated,
    RoomEnded,
    TokenRevoked,
    answer,
    answers,
    is_models,
    is_room,
    is_room_created,
    is_room_ended,
    is_token,
    is_token_revoked,
)
from .common import MediaInput, parse_result, raise_for_error, read_file, read_input
from .stream import RemoteStream, StreamEvent, speakers, start_message

if TYPE_CHECKING:
    from typing import Unpack

    from ..config import Settings
    from ..files import FileTranslator
    from ..tracing import Tracer
    from .local import LocalTranslator

DEFAULT_URL = "http://127.0.0.1:8000"
CONNECT_TIMEOUT_S = 10.0  # a server that is down or unreachable is told in seconds
# the longest wait for an answer: the server ends a file request at its own limit (server.request_timeout_s, 300 s
# by default) with 504 `timeout`; the rest is room for the upload and that answer. A server that accepted the
# connection and never answers fails the call after this long, not the 10 minutes it was before.
READ_TIMEOUT_S = 330.0


def http_timeout(timeout: float | None) -> httpx.Timeout:
    """``timeout``: seconds to wait for each read, write or pooled connection (``READ_TIMEOUT_S`` when None);
    connecting waits ``CONNECT_TIMEOUT_S``, or ``timeout`` when that is shorter."""
    limit = READ_TIMEOUT_S if timeout is None else timeout
    return httpx.Timeout(limit, connect=min(CONNECT_TIMEOUT_S, limit))


def _unreachable(exc: httpx.TransportError, base_url: str) -> LinguaFusionError:
    """httpx's failure as our error: a server connected to that sent no answer in time is a ``RequestTimeout``
    (504 ``timeout``, retryable); one that cannot be connected to (refused, unknown, connect timeout) a
    ``BackendError`` (503 ``backend_unavailable``, retryable)."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return RequestTimeout(f"{base_url} did not answer in time ({type(exc).__name__}); retry later, or pass "
                              "a longer timeout= for long files")
    return BackendError(f"cannot reach {base_url}: {exc}")


def ws_url(base_url: str) -> str:
    scheme, _, rest = base_url.partition("://")
    return ("wss" if scheme == "https" else "ws") + "://" + rest.rstrip("/") + "/v1/streams"


def _form(input_media: MediaInput | None, text: str | None, source_modality: str | None, target_lang: str,
          target_modality: str, source_lang: str | None, enable_glossary: bool, glossary_id: str | None,
          vocabulary_id: str | None = None, diarize: bool = False, max_speakers: int | None = None,
          word_timestamps: bool = False) -> RequestArgs:
    """httpx keyword arguments: the form's fields, and the file (none for a text)."""
    data, text, modality, filename = read_input(input_media, text, source_modality)
    fields = {"target_lang": target_lang, "target_modality": target_modality,
              "enable_glossary": "true" if enable_glossary else "false", "output_format": "json"}
    if modality:  # else the server tells it from the bytes
        fields["source_modality"] = modality
    if source_lang:
        fields["source_lang"] = source_lang
    if glossary_id:
        fields["glossary_id"] = glossary_id
    if vocabulary_id:  # a video's signs, read with this sign vocabulary: the result's ``signs``
        fields["vocabulary_id"] = vocabulary_id
    if diarize:  # each segment's speaker
        fields["diarize"] = "true"
    if max_speakers is not None:
        fields["max_speakers"] = str(max_speakers)
    if word_timestamps:  # speech: each segment's words with their times (``segments[i].words``)
        fields["word_timestamps"] = "true"
    if text is not None or data is None:  # read_input gives the bytes of anything but a text
        fields["text"] = text or ""
        return {"data": fields}
    return {"data": fields, "files": {"file": (filename or "upload", data, "application/octet-stream")}}


def _glossary_form(terms: dict[str, str] | str | os.PathLike[str], name: str | None) -> RequestArgs:
    if isinstance(terms, dict):
        raw = json.dumps(terms, ensure_ascii=False).encode("utf-8")
        return {"files": {"file": ("glossary.json", raw, "application/json")}, "data": {"name": name or "glossary"}}
    raw = read_file(terms, "glossary file")
    fname = os.path.basename(str(terms))
    return {"files": {"file": (fname, raw, "application/octet-stream")}, "data": {"name": name or fname}}


class _Base:
    """What both clients share: where the server is, the key, response checking, live streams."""

    def __init__(self, api_key: str | None, base_url: str | None) -> None:
        self.api_key = api_key or os.environ.get("LINGUAFUSION_API_KEY")
        self.base_url = (base_url or os.environ.get("LINGUAFUSION_URL") or DEFAULT_URL).rstrip("/")
        if self.api_key is not None and not (self.api_key.isascii() and self.api_key.isprintable()):
            # httpx would raise UnicodeEncodeError (or send a broken header) at the first request
            raise InvalidParameter("the API key holds characters a key never has (not printable ASCII); "
                                   "copy the sk_... key again", details={"field": "api_key"})
        try:
            url = httpx.URL(self.base_url)
        except httpx.InvalidURL as exc:
            raise InvalidParameter(f"the server URL {self.base_url!r} is not a URL: {exc}",
                                   details={"field": "base_url"}) from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise InvalidParameter(f"the server URL {self.base_url!r} is not an http:// or https:// URL "
                                   "(e.g. http://127.0.0.1:8000)", details={"field": "base_url"})
        self._headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _check(self, r: httpx.Response) -> JSONObject:
        body: JSONValue = None
        if r.headers.get("content-type", "").startswith("application/json"):
            try:
                body = r.json()
            except ValueError:  # a proxy or another program on the port: its body is no JSON
                body = None
        raise_for_error(r.status_code, body, r.headers)
        if not isinstance(body, dict):
            # a 2xx that is not a JSON object: the URL is not a LinguaFusion server (a wrong port, a proxy's page)
            raise BackendError(f"{self.base_url} answered {r.request.method} {r.request.url.path} with HTTP "
                               f"{r.status_code} and no JSON object; is --url a LinguaFusion server?",
                               details={"status": r.status_code})
        return body

    def stream(self, target_langs: list[str], *, source_lang: str = "en", slo: str = "standard",
               partials: bool = True, importance: float = 0.5, glossary_id: str | None = None,
               speech: bool = False, min_confidence: float = 0.4, audio_format: str = "pcm16",
               inputs: list[str] | None = None, room: bool | str | None = None,
               vocabulary_id: str | None = None, room_targets: list[str] | None = None,
               source_langs: list[str] | None = None, diarize: bool = False,
               max_speakers: int | None = None, word_timestamps: bool = False) -> RemoteStream:
        """A live stream over WebSocket: ``async with translator.stream(["es"]) as s: ...``. ``inputs``: what the
        stream will send (audio, image, text; all by default); a stream without audio reserves no speech capacity.
        ``room``: True publishes the stream as a new room (``s.ready["room_id"]``, ``s.ready["listener_token"]``),
        or the id of a room made with ``create_room()``; ``room_targets``: the languages its listeners may ask for
        beyond ``target_langs`` (each translated only while someone listens). ``vocabulary_id``: a sign or lip
        vocabulary of this key; the stream's video frames are then also read for signs (``sign`` events) or lips
        (fused into the finals: their ``modalities`` say ``["audio", "lips"]`` or ``["lips"]``). ``source_lang="auto"``:
        each utterance's language is detected (among ``source_langs`` when given) and each final says it.
        ``diarize``: each final's ``speaker`` ("S1", "S2", ..., at most ``max_speakers``); ``s.rename_speaker("S1",
        "Dr. Chen")`` names one (docs/diarization.md). ``word_timestamps``: each final's spoken ``words`` with their
        start and end in stream seconds."""
        start = start_message(target_langs, source_lang, slo, partials, importance, glossary_id, speech,
                              min_confidence, audio_format, inputs)
        if room:
            start["room"] = room
        if room_targets is not None:
            start["room_targets"] = room_targets
        if vocabulary_id:
            start["vocabulary_id"] = vocabulary_id
        if source_langs is not None:
            start["source_langs"] = source_langs
        speakers(start, diarize, max_speakers)
        if word_timestamps:
            start["word_timestamps"] = True
        return RemoteStream(ws_url(self.base_url), self.api_key, start)


class MultimodalTranslator(VocabularyMethods, _Base):
    """Client of a LinguaFusion server. ``MultimodalTranslator.local()`` runs the engine in-process instead.
    ``timeout``: seconds to wait for an answer (``http_timeout``: 330 s by default, connecting 10 s at most)."""

    def __init__(self, api_key: str | None = None, base_url: str | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(api_key, base_url)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=http_timeout(timeout))

    @staticmethod
    def local(*, settings: Settings | None = None, engine: FileTranslator | None = None,
              tracer: Tracer | None = None) -> LocalTranslator:
        from .local import LocalTranslator

        return LocalTranslator(settings=settings, engine=engine, tracer=tracer)

    def _call(self, method: str, path: str, **kw: Unpack[RequestArgs]) -> JSONObject:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise _unreachable(exc, self.base_url) from exc
        return self._check(r)

    def translate(self, input_media: MediaInput | None = None, *, target_lang: str, source_modality: str | None = None,
                  target_modality: str = "text", source_lang: str | None = None, text: str | None = None,
                  enable_glossary: bool = False, glossary_id: str | None = None,
                  vocabulary_id: str | None = None, diarize: bool = False,
                  max_speakers: int | None = None, word_timestamps: bool = False) -> TranslationResult:
        """``diarize``: each speech segment's speaker (``segments[i].speaker``, ``speaker_confidence``);
        ``max_speakers`` bounds how many (docs/diarization.md); ``word_timestamps``: each speech segment's words
        with their times (``segments[i].words``)."""
        form = _form(input_media, text, source_modality, target_lang, target_modality, source_lang,
                     enable_glossary, glossary_id, vocabulary_id, diarize, max_speakers, word_timestamps)
        return parse_result(self._call("POST", "/v1/translate", **form))

    def upload_glossary(self, terms: dict[str, str] | str | os.PathLike[str], name: str | None = None) -> str:
        return str(self._call("POST", "/v1/glossaries", **_glossary_form(terms, name))["glossary_id"])

    def models(self) -> ModelsJSON:
        return answer(self._call("GET", "/v1/models"), is_models, self.base_url, "GET /v1/models")

    def check_key(self) -> None:
        """Raise ``AuthenticationError`` (401) or ``PermissionDenied`` (403) unless this key may translate: the
        CLI asks before it spends time on a file (language detection, decoding)."""
        self._call("GET", "/v1/glossaries")

    def create_room(self, source_lang: str | None = None, allowed_targets: list[str] | None = None) -> RoomCreated:
        """A room to publish a stream into later (``stream(..., room=room_id)``): room_id, listener_token, token_id.
        ``allowed_targets``: the languages its listeners may ask for beyond the publisher's own targets."""
        return answer(self._call("POST", "/v1/rooms", json=_room_body(source_lang, allowed_targets)),
                      is_room_created, self.base_url, "POST /v1/rooms")

    def room_token(self, room_id: str) -> str:
        return str(self._call("POST", f"/v1/rooms/{room_id}/tokens")["listener_token"])

    def room_tokens(self, room_id: str) -> list[TokenJSON]:
        """The room's listener tokens: token_id, created, label (never the tokens themselves)."""
        return answers(self._call("GET", f"/v1/rooms/{room_id}/tokens")["tokens"], is_token, self.base_url,
                       "GET /v1/rooms/{id}/tokens")

    def revoke_room_token(self, room_id: str, token_id: str) -> TokenRevoked:
        return answer(self._call("DELETE", f"/v1/rooms/{room_id}/tokens/{token_id}"), is_token_revoked,
                      self.base_url, "DELETE /v1/rooms/{id}/tokens/{token_id}")

    def rooms(self) -> list[RoomJSON]:
        return answers(self._call("GET", "/v1/rooms")["rooms"], is_room, self.base_url, "GET /v1/rooms")

    def end_room(self, room_id: str) -> RoomEnded:
        return answer(self._call("DELETE", f"/v1/rooms/{room_id}"), is_room_ended, self.base_url,
                      "DELETE /v1/rooms/{id}")

    def listen(self, room_id: str, *, token: str, targets: list[str], after_seq: int = 0,
               speech: bool = False, on_break: Callable[[float], None] | None = None) -> Iterator[StreamEvent]:
        """A room's events with a listener token, every final once, in order, across reconnections
        (sdk/rooms.py). ``on_break(seconds)``: called when the connection breaks and reconnecting starts (for at
        most that long)."""
        from . import rooms

        return rooms.listen(self.base_url, room_id, token, targets, after_seq=after_seq, speech=speech,
                            on_break=on_break)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MultimodalTranslator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncMultimodalTranslator(AsyncVocabularyMethods, _Base):
    def __init__(self, api_key: str | None = None, base_url: str | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(api_key, base_url)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=http_timeout(timeout))

    async def _call(self, method: str, path: str, **kw: Unpack[RequestArgs]) -> JSONObject:
        try:
            r = await self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise _unreachable(exc, self.base_url) from exc
        return self._check(r)

    async def translate(self, input_media: MediaInput | None = None, *, target_lang: str,
                        source_modality: str | None = None, target_modality: str = "text",
                        source_lang: str | None = None, text: str | None = None, enable_glossary: bool = False,
                        glossary_id: str | None = None, vocabulary_id: str | None = None, diarize: bool = False,
                        max_speakers: int | None = None, word_timestamps: bool = False) -> TranslationResult:
        form = _form(input_media, text, source_modality, target_lang, target_modality, source_lang,
                     enable_glossary, glossary_id, vocabulary_id, diarize, max_speakers, word_timestamps)
        return parse_result(await self._call("POST", "/v1/translate", **form))

    async def upload_glossary(self, terms: dict[str, str] | str | os.PathLike[str], name: str | None = None) -> str:
        return str((await self._call("POST", "/v1/glossaries", **_glossary_form(terms, name)))["glossary_id"])

    async def models(self) -> ModelsJSON:
        return answer(await self._call("GET", "/v1/models"), is_models, self.base_url, "GET /v1/models")

    async def create_room(self, source_lang: str | None = None,
                          allowed_targets: list[str] | None = None) -> RoomCreated:
        return answer(await self._call("POST", "/v1/rooms", json=_room_body(source_lang, allowed_targets)),
                      is_room_created, self.base_url, "POST /v1/rooms")

    async def room_token(self, room_id: str) -> str:
        return str((await self._call("POST", f"/v1/rooms/{room_id}/tokens"))["listener_token"])

    async def room_tokens(self, room_id: str) -> list[TokenJSON]:
        return answers((await self._call("GET", f"/v1/rooms/{room_id}/tokens"))["tokens"], is_token, self.base_url,
                       "GET /v1/rooms/{id}/tokens")

    async def revoke_room_token(self, room_id: str, token_id: str) -> TokenRevoked:
        return answer(await self._call("DELETE", f"/v1/rooms/{room_id}/tokens/{token_id}"), is_token_revoked,
                      self.base_url, "DELETE /v1/rooms/{id}/tokens/{token_id}")

    async def rooms(self) -> list[RoomJSON]:
        return answers((await self._call("GET", "/v1/rooms"))["rooms"], is_room, self.base_url, "GET /v1/rooms")

    async def end_room(self, room_id: str) -> RoomEnded:
        return answer(await self._call("DELETE", f"/v1/rooms/{room_id}"), is_room_ended, self.base_url,
                      "DELETE /v1/rooms/{id}")

    def listen(self, room_id: str, *, token: str, targets: list[str], after_seq: int = 0,
               speech: bool = False, on_break: Callable[[float], None] | None = None) -> AsyncIterator[StreamEvent]:
        """``MultimodalTranslator.listen`` as an async iterator."""
        from . import rooms

        return rooms.alisten(self.base_url, room_id, token, targets, after_seq=after_seq, speech=speech,
                             on_break=on_break)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncMultimodalTranslator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _room_body(source_lang: str | None, allowed_targets: list[str] | None) -> dict[str, object]:
    body: dict[str, object] = {"source_lang": source_lang} if source_lang else {}
    if allowed_targets is not None:
        body["allowed_targets"] = allowed_targets
    return body
