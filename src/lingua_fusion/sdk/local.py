"""In-process translator: the same engine the server runs, no network. Raises the same typed errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .. import glossary as glossary_mod
from ..config import Settings
from ..errors import InvalidParameter, NotFound
from ..files import FileRequest, FileTranslator
from ..json_bounds import bounds_of
from ..tracing import Tracer, from_settings
from ..types import TranslationResult
from ..vision.client import LocalVocabularyMethods
from .answers import ModelsJSON, is_models
from .common import MediaInput, read_file, read_input

if TYPE_CHECKING:
    from ..stream.capacity import Principal
    from ..stream.service import StreamService
    from .stream import LocalStream


class LocalTranslator(LocalVocabularyMethods):
    def __init__(self, settings: Settings | None = None, engine: FileTranslator | None = None,
                 tracer: Tracer | None = None) -> None:
        self.settings = settings or Settings()
        self.engine = engine or FileTranslator(self.settings)
        # OpenTelemetry spans of in-process streams and translations (None, the default: off; lingua_fusion/tracing)
        self.tracer = tracer if tracer is not None else from_settings(self.settings)
        self._glossaries: dict[str, list[glossary_mod.Term]] = {}
        self._streams: StreamService | None = None

    def translate(self, input_media: MediaInput | None = None, *, target_lang: str,
                  source_modality: str | None = None, target_modality: str = "text",
                  source_lang: str | None = None, text: str | None = None, enable_glossary: bool = False,
                  glossary_id: str | None = None, vocabulary_id: str | None = None, diarize: bool = False,
                  max_speakers: int | None = None, word_timestamps: bool = False) -> TranslationResult:
        # FileTranslator.translate validates the request (size, modality vs bytes, UTF-8, languages, pair) as
        # it does for the server; a text file is handed over as bytes so that it gets the same checks
        data, text, modality, filename = read_input(input_media, text, source_modality)
        terms: list[glossary_mod.Term] = []
        if enable_glossary:
            gid = glossary_id or (list(self._glossaries)[-1] if self._glossaries else None)
            if gid is None:
                raise InvalidParameter("enable_glossary is set but no glossary was uploaded: call "
                                       "upload_glossary first", details={"field": "enable_glossary"})
            terms = self._glossary(gid)
        signs = None
        if vocabulary_id:  # a video's signs, read with this sign vocabulary (vision/file_signs.py)
            from ..vision import file_signs

            signs = file_signs.reader(self._vision(), self.OWNER, vocabulary_id, "local")
        req = FileRequest(source_modality=modality, target_lang=target_lang, target_modality=target_modality,
                          source_lang=source_lang, data=data, text=text, glossary=terms, filename=filename,
                          signs=signs, diarize=diarize, max_speakers=max_speakers,
                          word_timestamps=word_timestamps)
        if self.tracer is None:
            return self.engine.translate(req)
        trace = self.tracer.root("translate")
        try:
            return self.engine.translate(req, trace=trace)
        except Exception as exc:
            trace.fail(exc)
            raise
        finally:
            trace.end()

    def upload_glossary(self, terms: dict[str, str] | str | os.PathLike[str], name: str | None = None) -> str:
        if isinstance(terms, dict):  # checked as the server checks the SDK's upload of it (JSON)
            import json

            parsed = glossary_mod.parse(json.dumps(terms, ensure_ascii=False).encode("utf-8"),
                                        max_terms=self.settings.limits.max_glossary_terms, filename="glossary.json",
                                        bounds=bounds_of(self.settings))
        else:
            p = Path(terms)
            parsed = glossary_mod.parse(read_file(p, "glossary file"),
                                        max_terms=self.settings.limits.max_glossary_terms, filename=p.name,
                                        bounds=bounds_of(self.settings))
        gid = f"local_{len(self._glossaries) + 1}"
        self._glossaries[gid] = parsed
        return gid

    def stream(self, target_langs: list[str], *, source_lang: str = "en", slo: str = "standard",
               partials: bool = True, importance: float = 0.5, glossary_id: str | None = None,
               speech: bool = False, min_confidence: float = 0.4, audio_format: str = "pcm16",
               inputs: list[str] | None = None, vocabulary_id: str | None = None,
               source_langs: list[str] | None = None, diarize: bool = False,
               max_speakers: int | None = None, word_timestamps: bool = False) -> LocalStream:
        """A live stream on an in-process StreamService (same interface and behaviour as the remote one)."""
        from ..vision.stream_signs import StreamVocabularies
        from .stream import LocalStream, speakers, start_message

        start = start_message(target_langs, source_lang, slo, partials, importance, glossary_id, speech,
                              min_confidence, audio_format, inputs)
        speakers(start, diarize, max_speakers)
        if word_timestamps:
            start["word_timestamps"] = True
        if source_langs is not None:
            start["source_langs"] = source_langs
        if vocabulary_id:
            start["vocabulary_id"] = vocabulary_id
            service = self.streams()  # the stream reads this translator's vocabularies (vision/client.py)
            if service.vocabularies is None:
                service.vocabularies = StreamVocabularies(self._vision())
        return LocalStream(self.streams(), start)

    def streams(self) -> StreamService:
        """This translator's StreamService (made on first use): every in-process stream goes through it."""
        from ..serving.engine import in_process
        from ..stream.service import StreamService
        from ..stream.supervisor import BreakerSupervisor

        if self._streams is None:
            breakers = BreakerSupervisor(self.settings)  # the engine's StageObserver and the service's breakers
            self._streams = StreamService(in_process(self.engine.registry, self.settings, observer=breakers),
                                          self.settings, supervisor=breakers, glossary_for=self._stream_glossary)
            self._streams.tracer = self.tracer
        return self._streams

    async def close_streams(self) -> None:
        """End this translator's in-process streams and stop the engine it made for them (on the loop they ran on;
        a new stream afterwards starts a new service)."""
        if self._streams is not None:
            service, self._streams = self._streams, None
            await service.close()  # the service closes only what it made; the engine is this translator's
            await service.executor.close()

    async def _stream_glossary(self, _who: Principal, gid: str) -> list[glossary_mod.Term]:
        return self._glossary(gid)

    def _glossary(self, gid: str) -> list[glossary_mod.Term]:
        if gid not in self._glossaries:
            raise NotFound(f"no glossary {gid}")
        return self._glossaries[gid]

    def check_key(self) -> None:
        """In-process there is no key to check (the same face as ``MultimodalTranslator.check_key``)."""

    def models(self) -> ModelsJSON:
        """What ``GET /v1/models`` answers, from this process's registry (the same shape, checked the same way)."""
        registry = self.engine.registry
        body: dict[str, object] = {"models": registry.capabilities(), "pairs": registry.served_pairs(),
                                   "routes": registry.pair_routes()}
        if not is_models(body):
            raise TypeError(f"the registry's models answer is malformed: {sorted(body)}")
        return body

    def close(self) -> None:
        self.close_vision()
        self.engine.close()
        if self.tracer is not None:
            self.tracer.shutdown()

    def __enter__(self) -> LocalTranslator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
