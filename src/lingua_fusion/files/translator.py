"""File translation: validate -> decode -> recognise -> translate -> emit, one request per call (thread-safe).

The translator knows nothing of HTTP. ``FileTranslator.validate`` is the one place a request is checked
(files/validate.py: size, presence, languages, pair, modalities, the bytes against the declared modality); the API
and the in-process SDK both go through it. It raises errors from ``lingua_fusion.errors``; the API maps them to
codes. ``translate`` runs the stages, each in a module of its own:

    files/recognise.py  input -> source segments by modality (text, image + OCR, video, audio)
    files/speech.py     speech -> segments (Whisper; slide terms corrected)
    files/diarize.py    with diarize: each speech segment's speaker (voice embeddings on the engine, clustered)
    files/visuals.py    a video's frames -> slides and signs; slide names kept; slides and signs translated
    files/mt.py         segments through an MT route (glossary, translation memory, deadline)
    files/result.py     warnings, the TranslationResult, TTS / braille output
    files/work.py       what a request carries between them (``Work``) and per-stage timing (``Stages``)
    files/engine.py     every model call of theirs as work items on the serving engine (``EngineLink``)

The models run on the engine: the API server's (``use_engine``: the streams' port, so a file's work shares each
model's batches and fair queues with live streams), or, with no server, an engine of the translator's own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from ..config import Settings
from ..deadline import Deadline
from ..errors import NoContent
from ..glossary import Term
from ..models.registry import Registry
from ..models.routes import MTRoute
from ..models.transcript_guard import script_for
from ..serving.ports import ModelPort
from ..tracing import TraceRef
from ..types import Modality, TranslationResult
from .diarize import SpeakerLabeller
from .engine import EngineLink, FileCall, OwnEngine
from .mt import SegmentMT
from .recognise import SENTENCE, Recogniser
from .request import FileRequest, ValidRequest
from .result import SPEECH_CONFIDENT, assemble, render
from .speech import SpeechRecogniser
from .validate import RequestValidator, check_pair
from .visuals import VideoVisuals
from .work import Stages, Work

SPEECH = {Modality.AUDIO, Modality.VIDEO}  # sources whose segments are cut by pauses, not by sentences

__all__ = ["SENTENCE", "SPEECH_CONFIDENT", "FileRequest", "FileTranslator", "ValidRequest"]


class StageObserver(Protocol):
    """Who hears each stage's time (the server's Metrics)."""

    def stage(self, name: str, seconds: float) -> None: ...


class FileTranslator:
    def __init__(self, settings: Settings | None = None, registry: Registry | None = None) -> None:
        self.settings = settings or Settings()
        self.registry = registry or Registry(self.settings)
        self.observer: StageObserver | None = None  # set by the API (the server's Metrics)
        self.slide_context = True  # a video's slide words feed ASR (hot words) and MT (names kept as written)
        self._validator = RequestValidator(self.settings, self.registry)
        self._link: EngineLink | None = None  # the server's engine (use_engine)
        self._own: OwnEngine | None = None  # with no server: started at the first request, closed with close()
        self._lock = threading.Lock()
        self._mt = SegmentMT(self.registry, self.engine)
        self._visuals = VideoVisuals(self.settings, self.registry, self._mt, self.engine)
        self._recogniser = Recogniser(self.settings, self.registry, SpeechRecogniser(self.registry, self.engine),
                                      self._visuals, self.engine, SpeakerLabeller(self.settings.diarize, self.engine))

    def use_engine(self, port: ModelPort | None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Run the model work on ``port``, an engine on ``loop`` (the API server's, at start-up); None: back to
        an engine of the translator's own (at shut-down)."""
        with self._lock:
            self._link = None if port is None or loop is None else EngineLink(
                port, loop, self.settings.server.request_timeout_s)

    def engine(self) -> EngineLink:
        """Where this translator's model work runs now."""
        with self._lock:
            if self._link is not None:
                return self._link
            if self._own is None:
                self._own = OwnEngine(self.registry, self.settings)
            return self._own.link

    def validate(self, req: FileRequest) -> ValidRequest:
        """Check a request without decoding its media (``RequestValidator.validate``): every check, before any
        work; a text's language, when not given, is identified here."""
        return self._validator.validate(req)

    def check_pair(self, source: str | None, target: str) -> MTRoute | None:
        return check_pair(self.registry, source, target)

    def translate(self, req: FileRequest | ValidRequest, *, deadline: Deadline | None = None,
                  trace: TraceRef | None = None) -> TranslationResult:
        """Translate a request: a FileRequest is validated first (``validate``), a ValidRequest not again.
        ``deadline``: checked as each stage starts and between MT chunks (RequestTimeout past it). ``trace``: the
        request's span (tracing on), parent of one span per stage."""
        st = Stages(deadline, trace)
        valid = req if isinstance(req, ValidRequest) else self.validate(req)
        call = st.call = FileCall(key_id=valid.request.scope, deadline=deadline, trace=trace)
        glossary, tgt_mod = valid.request.glossary, valid.target_modality
        work = Work(source=valid.source_lang, target=valid.target_lang, route=valid.route, call=call,
                    speech_translation=valid.speech_translation, confidence=valid.source_confidence,
                    detected=valid.source_confidence is not None, transcribe_only=valid.request.transcribe_only,
                    slide_context=self.slide_context, word_timestamps=valid.request.word_timestamps,
                    source_script=script_for(valid.request.source_lang),
                    target_script=script_for(valid.request.target_lang))
        segs = self._recogniser.recognise(valid, work, st)
        if not segs and not (work.video is not None and work.video.slides) and not any(
                s.recognition.known for s in work.signs):
            raise NoContent("no speech or text was found in the input")
        if work.source is None and valid.request.signs is not None:  # only signs: their vocabulary's language
            work.source = valid.request.signs.lang
        assert work.source is not None
        if work.speech_translation:
            work.models["mt"] = "none (Whisper speech translation)" if work.route is None else ""
            for s in segs:
                s.source_text = s.text  # Whisper's English is the only transcript there is
        elif work.source == work.target:
            work.route = None
        elif work.route is None:
            work.route = self.registry.mt_route(work.source, work.target)
        applied: list[Term] = []
        if work.route is not None and segs:
            names = self._visuals.slide_names(work, segs, glossary)
            with st.stage("mt"):
                applied = self._mt.translate(segs, work.route, glossary, work.models, call, names=names,
                                             sentences=valid.source_modality in SPEECH,
                                             unknown=work.untranslated, script=work.target_script)
        slides = self._visuals.slides(work, glossary, tgt_mod, st) \
            if work.video is not None and work.video.slides else []
        reader = valid.request.signs  # work.signs is what it read: never any without it
        signs = self._visuals.signs(reader, work, st) if work.signs and reader is not None else []
        result = assemble(valid, work, segs, slides, signs, applied)
        render(self.registry, self.engine(), call, result, tgt_mod, st)
        result.latency_ms = st.total()
        if trace is not None:
            trace.set(source_lang=result.source_lang, target_lang=result.target_lang, route=result.route)
        if self.observer is not None:
            for k, v in result.latency_ms.items():
                self.observer.stage(k, v / 1000)
        return result

    def close(self) -> None:
        with self._lock:
            own, self._own = self._own, None
        if own is not None:
            own.close()
        self.registry.close()
