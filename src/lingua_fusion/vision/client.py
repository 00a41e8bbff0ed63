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
from pathlib import Path
from typing import Any

from ..errors import InvalidParameter
from .landmarks import LandmarkSeq

Frames = list[dict[str, Any]] | LandmarkSeq
Video = str | os.PathLike[str] | bytes


def _frames(frames: Frames) -> list[dict[str, Any]]:
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


def _request(frames: Frames | None, video: Video | None, fields: dict[str, str]) -> dict[str, Any]:
    """httpx keyword arguments: JSON landmarks, or a multipart video upload."""
    if (frames is None) == (video is None):
        raise InvalidParameter("pass frames (landmarks) or video, exactly one", details={"field": "frames"})
    if frames is not None:
        return {"json": {**fields, "frames": _frames(frames)}}
    return {"data": fields, "files": {"file": ("video", _video_bytes(video or b""), "application/octet-stream")}}


def _document(doc: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    if isinstance(doc, dict):
        return doc
    try:
        loaded = json.loads(read_file(doc, "vocabulary file"))
    except ValueError as exc:
        raise InvalidParameter(f"{doc} is not a JSON vocabulary export") from exc
    if not isinstance(loaded, dict):
        raise InvalidParameter(f"{doc} is not a JSON vocabulary export")
    return loaded


def _write(doc: dict[str, Any], path: str | os.PathLike[str] | None) -> dict[str, Any]:
    if path is not None:
        Path(path).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return doc


class VocabularyMethods:
    """For the HTTP client: ``self._call(method, path, **httpx_kwargs)`` returns the JSON body."""

    def _call(self, method: str, path: str, **kw: Any) -> Any:  # provided by the client
        raise NotImplementedError

    def create_vocabulary(self, name: str, kind: str = "sign", lang: str = "en") -> dict[str, Any]:
        return dict(self._call("POST", "/v1/vocabularies", json={"name": name, "kind": kind, "lang": lang}))

    def vocabularies(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/vocabularies")["vocabularies"])

    def vocabulary(self, vocab_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/vocabularies/{vocab_id}"))

    def delete_vocabulary(self, vocab_id: str) -> None:
        self._call("DELETE", f"/v1/vocabularies/{vocab_id}")

    def add_example(self, vocab_id: str, gloss: str, *, frames: Frames | None = None,
                    video: Video | None = None) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/vocabularies/{vocab_id}/examples",
                               **_request(frames, video, {"gloss": gloss})))

    def delete_example(self, vocab_id: str, example_id: str) -> None:
        self._call("DELETE", f"/v1/vocabularies/{vocab_id}/examples/{example_id}")

    def export_vocabulary(self, vocab_id: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        return _write(dict(self._call("GET", f"/v1/vocabularies/{vocab_id}/export")), path)

    def import_vocabulary(self, doc: dict[str, Any] | str | os.PathLike[str], name: str | None = None
                          ) -> dict[str, Any]:
        params = {"name": name} if name else None
        return dict(self._call("POST", "/v1/vocabularies/import", json=_document(doc), params=params))

    def recognise(self, vocab_id: str, *, frames: Frames | None = None, video: Video | None = None,
                  target_lang: str | None = None) -> dict[str, Any]:
        fields = {"target_lang": target_lang} if target_lang else {}
        return dict(self._call("POST", f"/v1/vocabularies/{vocab_id}/recognise", **_request(frames, video, fields)))


class AsyncVocabularyMethods:
    """The same as coroutines, for ``AsyncMultimodalTranslator``."""

    async def _call(self, method: str, path: str, **kw: Any) -> Any:  # provided by the client
        raise NotImplementedError

    async def create_vocabulary(self, name: str, kind: str = "sign", lang: str = "en") -> dict[str, Any]:
        return dict(await self._call("POST", "/v1/vocabularies", json={"name": name, "kind": kind, "lang": lang}))

    async def vocabularies(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/vocabularies"))["vocabularies"])

    async def vocabulary(self, vocab_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/vocabularies/{vocab_id}"))

    async def delete_vocabulary(self, vocab_id: str) -> None:
        await self._call("DELETE", f"/v1/vocabularies/{vocab_id}")

    async def delete_example(self, vocab_id: str, example_id: str) -> None:
        await self._call("DELETE", f"/v1/vocabularies/{vocab_id}/examples/{example_id}")

    async def add_example(self, vocab_id: str, gloss: str, *, frames: Frames | None = None,
                          video: Video | None = None) -> dict[str, Any]:
        return dict(await self._call("POST", f"/v1/vocabularies/{vocab_id}/examples",
                                     **_request(frames, video, {"gloss": gloss})))

    async def export_vocabulary(self, vocab_id: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        return _write(dict(await self._call("GET", f"/v1/vocabularies/{vocab_id}/export")), path)

    async def import_vocabulary(self, doc: dict[str, Any] | str | os.PathLike[str], name: str | None = None
                                ) -> dict[str, Any]:
        params = {"name": name} if name else None
        return dict(await self._call("POST", "/v1/vocabularies/import", json=_document(doc), params=params))

    async def recognise(self, vocab_id: str, *, frames: Frames | None = None, video: Video | None = None,
                        target_lang: str | None = None) -> dict[str, Any]:
        fields = {"target_lang": target_lang} if target_lang else {}
        return dict(await self._call("POST", f"/v1/vocabularies/{vocab_id}/recognise",
                                     **_request(frames, video, fields)))


class LocalVocabularyMethods:
    """The same methods in-process (``LocalTranslator``): the vocabularies live in the settings' state directory
    (or their Redis: ``vocab_port.open_vocabularies``), owned by the key id "local"."""

    OWNER = "local"
    settings: Any
    engine: Any
    _vision_service: Any = None

    def _vision(self) -> Any:
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

    def create_vocabulary(self, name: str, kind: str = "sign", lang: str = "en") -> dict[str, Any]:
        return dict(self._vision().store.create(self.OWNER, name, kind, lang).to_dict())

    def vocabularies(self) -> list[dict[str, Any]]:
        return [v.to_dict() for v in self._vision().store.list(self.OWNER)]

    def vocabulary(self, vocab_id: str) -> dict[str, Any]:
        store = self._vision().store
        return {**store.get(self.OWNER, vocab_id).to_dict(), "examples": store.examples(self.OWNER, vocab_id)}

    def delete_vocabulary(self, vocab_id: str) -> None:
        self._vision().store.delete(self.OWNER, vocab_id)

    def add_example(self, vocab_id: str, gloss: str, *, frames: Frames | None = None,
                    video: Video | None = None) -> dict[str, Any]:
        store = self._vision().store
        kind = store.get(self.OWNER, vocab_id).kind
        return {"vocabulary_id": vocab_id, **store.add_example(self.OWNER, vocab_id, gloss,
                                                               self._sequence(kind, frames, video))}

    def delete_example(self, vocab_id: str, example_id: str) -> None:
        self._vision().store.delete_example(self.OWNER, vocab_id, example_id)

    def export_vocabulary(self, vocab_id: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        return _write(self._vision().store.export(self.OWNER, vocab_id), path)

    def import_vocabulary(self, doc: dict[str, Any] | str | os.PathLike[str], name: str | None = None
                          ) -> dict[str, Any]:
        return dict(self._vision().store.import_(self.OWNER, _document(doc), name).to_dict())

    def recognise(self, vocab_id: str, *, frames: Frames | None = None, video: Video | None = None,
                  target_lang: str | None = None) -> dict[str, Any]:
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
