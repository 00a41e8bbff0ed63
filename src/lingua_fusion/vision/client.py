"""The SDK's vocabulary methods (``MultimodalTranslator``, ``AsyncMultimodalTranslator``, ``LocalTranslator``).

    vid = translator.create_vocabulary("my signs", kind="sign")["vocabulary_id"]
    translator.add_example(vid, "hello", video="hello.mp4")       # or frames=[{t, left_hand, right_hand, ...}]
    translator.recognise(vid, video="clip.mp4", target_lang="es")  # {"glosses": [...], "source_text", "text"}
    doc = translator.export_vocabulary(vid, "signs.json"); translator.import_vocabulary("signs.json")

Landmark frames may be given as the JSON list or as a ``LandmarkSeq``; a video as a path or bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..errors import BackendError, InvalidParameter
from ..json_types import JSONObject, JSONValue
from .landmarks import FrameJSON, LandmarkSeq

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..config import Settings
    from ..files import FileTranslator
    from .service import RecognitionJSON, VisionService
    from .vocab_model import ExampleJSON, VocabularyJSON

Frames = Sequence[Mapping[str, object]] | LandmarkSeq
Video = str | os.PathLike[str] | bytes


def _frames(frames: Frames) -> Sequence[Mapping[str, object]] | list[FrameJSON]:
    return frames.to_json() if isinstance(frames, LandmarkSeq) else frames


def read_file(path: str | os.PathLike[str], what: str) -> bytes:
    """A client-side file's bytes; missing or unreadable is an ``invalid_parameter`` (as ``sdk.common``'s)."""
    p = Path(path)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise InvalidParameter(f"cannot read {what} {p}: {exc.strerror or exc}", details={"path": str(p)}) from exc


def _video_bytes(video: Video) -> bytes:
    return video if isinstance(video, bytes) else read_file(video, "video")


class RequestArgs(TypedDict, total=False):
    """The httpx keyword arguments the vocabulary methods pass to the client's ``_call``."""

    json: object
    data: Mapping[str, str]
    files: Mapping[str, tuple[str, bytes, str]]
    params: Mapping[str, str] | None


class VocabularyDetail(TypedDict):
    """One vocabulary with its examples (``LocalTranslator.vocabulary``)."""

    vocabulary_id: str
    name: str
    kind: str
    lang: str
    created: float
    examples: list[ExampleJSON]
    glosses: int


class AddedToVocabulary(TypedDict):
    """The answer of ``LocalTranslator.add_example``: the vocabulary's id and ``vocab_model.AddedExample``."""

    vocabulary_id: str
    example_id: str
    gloss: str
    frames: int
    duration_s: float


def objects(value: JSONValue, base_url: str, what: str) -> list[JSONObject]:
    """A response's list of objects (``body["vocabularies"]``); anything else is not a LinguaFusion server's."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BackendError(f"{base_url} answered {what} without a list of objects; is --url a LinguaFusion server?")
    return [v for v in value if isinstance(v, dict)]


def _request(frames: Frames | None, video: Video | None, fields: dict[str, str]) -> RequestArgs:
    """httpx keyword arguments: JSON landmarks, or a multipart video upload."""
    if (frames is None) == (video is None):
        raise InvalidParameter("pass frames (landmarks) or video, exactly one", details={"field": "frames"})
    if frames is not None:
        return {"json": {**fields, "frames": _frames(frames)}}
    return {"data": fields, "files": {"file": ("video", _video_bytes(video or b""), "application/octet-stream")}}


def _document(doc: JSONObject | str | os.PathLike[str]) -> JSONObject:
    if isinstance(doc, dict):
        return doc
    try:
        loaded: JSONValue = json.loads(read_file(doc, "vocabulary file"))
    except ValueError as exc:
        raise InvalidParameter(f"{doc} is not a JSON vocabulary export") from exc
    if not isinstance(loaded, dict):
        raise InvalidParameter(f"{doc} is not a JSON vocabulary export")
    return loaded


def _write(doc: JSONObject, path: str | os.PathLike[str] | None) -> JSONObject:
    if path is not None:
        Path(path).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return doc


class VocabularyMethods:
    """For the HTTP client: ``self._call(method, path, **httpx_kwargs)`` returns the JSON body."""

    base_url: str

    def _call(self, method: str, path: str, **kw: Unpack[RequestArgs]) -> JSONObject:  # provided by the client
        raise NotImplementedError

    def create_vocabulary(self, name: str, kind: str = "sign", lang: str = "en") -> JSONObject:
        return dict(self._call("POST", "/v1/vocabularies", json={"name": name, "kind": kind, "lang": lang}))

    def vocabularies(self) -> list[JSONObject]:
        return objects(self._call("GET", "/v1/vocabularies")["vocabularies"], self.base_url, "GET /v1/vocabularies")

    def vocabulary(self, vocab_id: str) -> JSONObject:
        return dict(self._call("GET", f"/v1/vocabularies/{vocab_id}"))

    def delete_vocabulary(self, vocab_id: str) -> None:
        self._call("DELETE", f"/v1/vocabularies/{vocab_id}")

    def add_example(self, vocab_id: str, gloss: str, *, frames: Frames | None = None,
                    video: Video | None = None) -> JSONObject:
        return dict(self._call("POST", f"/v1/vocabularies/{vocab_id}/examples",
                               **_request(frames, video, {"gloss": gloss})))

    def delete_example(self, vocab_id: str, example_id: str) -> None:
        self._call("DELETE", f"/v1/vocabularies/{vocab_id}/examples/{example_id}")

    def export_vocabulary(self, vocab_id: str, path: str | os.PathLike[str] | None = None) -> JSONObject:
        return _write(dict(self._call("GET", f"/v1/vocabularies/{vocab_id}/export")), path)

    def import_vocabulary(self, doc: JSONObject | str | os.PathLike[str], name: str | None = None
                          ) -> JSONObject:
        params = {"name": name} if name else None
        return dict(self._call("POST", "/v1/vocabularies/import", json=_document(doc), params=params))

    def recognise(self, vocab_id: str, *, frames: Frames | None = None, video: Video | None = None,
                  target_lang: str | None = None) -> JSONObject:
        fields = {"target_lang": target_lang} if target_lang else {}
        return dict(self._call("POST", f"/v1/vocabularies/{vocab_id}/recognise", **_request(frames, video, fields)))


class AsyncVocabularyMethods:
    """The same as coroutines, for ``AsyncMultimodalTranslator``."""

    base_url: str

    async def _call(self, method: str, path: str, **kw: Unpack[RequestArgs]) -> JSONObject:  # by the client
        raise NotImplementedError

    async def create_vocabulary(self, name: str, kind: str = "sign", lang: str = "en") -> JSONObject:
        return dict(await self._call("POST", "/v1/vocabularies", json={"name": name, "kind": kind, "lang": lang}))

    async def vocabularies(self) -> list[JSONObject]:
        body = await self._call("GET", "/v1/vocabularies")
        return objects(body["vocabularies"], self.base_url, "GET /v1/vocabularies")

    async def vocabulary(self, vocab_id: str) -> JSONObject:
        return dict(await self._call("GET", f"/v1/vocabularies/{vocab_id}"))

    async def delete_vocabulary(self, vocab_id: str) -> None:
        await self._call("DELETE", f"/v1/vocabularies/{vocab_id}")

    async def delete_example(self, vocab_id: str, example_id: str) -> None:
        await self._call("DELETE", f"/v1/vocabularies/{vocab_id}/examples/{example_id}")

    async def add_example(self, vocab_id: str, gloss: str, *, frames: Frames | None = None,
                          video: Video | None = None) -> JSONObject:
        return dict(await self._call("POST", f"/v1/vocabularies/{vocab_id}/examples",
                                     **_request(frames, video, {"gloss": gloss})))

    async def export_vocabulary(self, vocab_id: str, path: str | os.PathLike[str] | None = None) -> JSONObject:
        return _write(dict(await self._call("GET", f"/v1/vocabularies/{vocab_id}/export")), path)

    async def import_vocabulary(self, doc: JSONObject | str | os.PathLike[str], name: str | None = None
                                ) -> JSONObject:
        params = {"name": name} if name else None
        return dict(await self._call("POST", "/v1/vocabularies/import", json=_document(doc), params=params))

    async def recognise(self, vocab_id: str, *, frames: Frames | None = None, video: Video | None = None,
                        target_lang: str | None = None) -> JSONObject:
        fields = {"target_lang": target_lang} if target_lang else {}
        return dict(await self._call("POST", f"/v1/vocabularies/{vocab_id}/recognise",
                                     **_request(frames, video, fields)))


class LocalVocabularyMethods:
    """The same methods in-process (``LocalTranslator``): the vocabularies live in the settings' state directory
    (or their Redis: ``vocab_port.open_vocabularies``), owned by the key id "local"."""

    OWNER = "local"
    settings: Settings
    engine: FileTranslator
    _vision_service: VisionService | None = None

    def _vision(self) -> VisionService:
        if self._vision_service is None:
            from .service import VisionService
            from .vocab_port import open_vocabularies

            self._vision_service = VisionService(self.settings, open_vocabularies(self.settings))
        return self._vision_service

    def _sequence(self, kind: str, frames: Frames | None, video: Video | None) -> LandmarkSeq:
        if (frames is None) == (video is None):
            raise InvalidParameter("pass frames (landmarks) or video, exactly one", details={"field": "frames"})
        if frames is not None:
            return frames if isinstance(frames, LandmarkSeq) else LandmarkSeq.from_json(frames)
        return self._vision().landmarks_from_video(_video_bytes(video or b""), kind)

    def create_vocabulary(self, name: str, kind: str = "sign", lang: str = "en") -> VocabularyJSON:
        return self._vision().store.create(self.OWNER, name, kind, lang).to_dict()

    def vocabularies(self) -> list[VocabularyJSON]:
        return [v.to_dict() for v in self._vision().store.list(self.OWNER)]

    def vocabulary(self, vocab_id: str) -> VocabularyDetail:
        store = self._vision().store
        v = store.get(self.OWNER, vocab_id).to_dict()
        return {"vocabulary_id": v["vocabulary_id"], "name": v["name"], "kind": v["kind"], "lang": v["lang"],
                "created": v["created"], "examples": store.examples(self.OWNER, vocab_id), "glosses": v["glosses"]}

    def delete_vocabulary(self, vocab_id: str) -> None:
        self._vision().store.delete(self.OWNER, vocab_id)

    def add_example(self, vocab_id: str, gloss: str, *, frames: Frames | None = None,
                    video: Video | None = None) -> AddedToVocabulary:
        store = self._vision().store
        kind = store.get(self.OWNER, vocab_id).kind
        added = store.add_example(self.OWNER, vocab_id, gloss, self._sequence(kind, frames, video))
        return {"vocabulary_id": vocab_id, "example_id": added["example_id"], "gloss": added["gloss"],
                "frames": added["frames"], "duration_s": added["duration_s"]}

    def delete_example(self, vocab_id: str, example_id: str) -> None:
        self._vision().store.delete_example(self.OWNER, vocab_id, example_id)

    def export_vocabulary(self, vocab_id: str, path: str | os.PathLike[str] | None = None) -> JSONObject:
        return _write(self._vision().store.export(self.OWNER, vocab_id), path)

    def import_vocabulary(self, doc: JSONObject | str | os.PathLike[str], name: str | None = None
                          ) -> VocabularyJSON:
        return self._vision().store.import_(self.OWNER, _document(doc), name).to_dict()

    def recognise(self, vocab_id: str, *, frames: Frames | None = None, video: Video | None = None,
                  target_lang: str | None = None) -> RecognitionJSON:
        from ..files import FileRequest
        from .service import recognition_body

        service = self._vision()
        vocab = service.store.get(self.OWNER, vocab_id)
        translate = None
        if target_lang:
            def translate(text: str) -> str:
                return str(self.engine.translate(FileRequest(source_modality="text", target_lang=target_lang,
                                                             source_lang=vocab.lang, text=text)).text)
        seq = self._sequence(vocab.kind, frames, video)
        spans = service.recognise(self.OWNER, vocab_id, seq, translate)
        return recognition_body(vocab_id, vocab.kind, len(seq), spans, bool(target_lang))

    def close_vision(self) -> None:
        if self._vision_service is not None:
            self._vision_service.close()
            self._vision_service.store.close()
            self._vision_service = None
