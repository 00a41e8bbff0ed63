"""File translation: validate -> decode -> recognise -> translate -> emit, one request per call (thread-safe).

The translator knows nothing of HTTP. ``FileTranslator.validate`` is the one place a request is checked
(files/validate.py: size, presence, languages, pair, modalities, the bytes against the declared modality); the API
and the in-process SDK both go through it. It raises errors from ``lingua_fusion.errors``; the API maps them to
codes. ``translate`` runs the stages, each in a module of its own:

    files/recognise.py  input -> source segments by modality (text, image + OCR, video, audio)
    files/speech.py     speech -> segments (Whisper; slide terms corrected)
    files/visuals.py    a video's frames -> slides and signs; slide names kept; slides and signs translated
    files/mt.py         segments through an MT route (glossary, translation memory, deadline)
    files/result.py     warnings, the TranslationResult, TTS / braille output
    files/work.py       what a request carries between them (``Work``) and per-stage timing (``Stages``)
"""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..deadline import Deadline
from ..errors import NoContent
from ..glossary import Term
from ..models.registry import MTRoute, Registry
from ..models.transcript_guard import script_for
from ..tracing import TraceRef
from ..types import Modality, TranslationResult
from .mt import MT_CHUNK, SegmentMT
from .recognise import SENTENCE, Recogniser
from .request import FileRequest, ValidRequest
from .result import SPEECH_CONFIDENT, assemble, render
from .speech import SpeechRecogniser
from .validate import RequestValidator, check_pair
from .visuals import VideoVisuals
from .work import Stages, Work

SPEECH = {Modality.AUDIO, Modality.VIDEO}  # sources whose segments are cut by pauses, not by sentences

__all__ = ["MT_CHUNK", "SENTENCE", "SPEECH_CONFIDENT", "FileRequest", "FileTranslator", "ValidRequest"]


class FileTranslator:
    def __init__(self, settings: Settings | None = None, registry: Registry | None = None) -> None:
        self.settings = settings or Settings()
        self.registry = registry or Registry(self.settings)
        self.observer: Any = None  # set by the API: observer.stage(name, seconds)
        self.slide_context = True  # a video's slide words feed ASR (hot words) and MT (names kept as written)
        self._validator = RequestValidator(self.settings, self.registry)
        self._mt = SegmentMT(self.registry)
        self._visuals = VideoVisuals(self.settings, self.registry, self._mt)
        self._recogniser = Recogniser(self.settings, self.registry, SpeechRecogniser(self.registry), self._visuals)

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
        glossary, tgt_mod = valid.request.glossary, valid.target_modality
        work = Work(source=valid.source_lang, target=valid.target_lang, route=valid.route,
                    speech_translation=valid.speech_translation, confidence=valid.source_confidence,
                    detected=valid.source_confidence is not None, transcribe_only=valid.request.transcribe_only,
                    slide_context=self.slide_context, scope=valid.request.scope,
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
                applied = self._mt.translate(segs, work.route, glossary + names, work.models, st.deadline,
                                             scope=work.scope, sentences=valid.source_modality in SPEECH,
                                             unknown=work.untranslated, script=work.target_script)
            applied = [t for t in applied if t not in names]
        slides = self._visuals.slides(work, glossary, tgt_mod, st) \
            if work.video is not None and work.video.slides else []
        signs = self._visuals.signs(valid.request.signs, work, st) if work.signs else []
        result = assemble(valid, work, segs, slides, signs, applied)
        render(self.registry, result, tgt_mod, st)
        result.latency_ms = st.total()
        if trace is not None:
            trace.set(source_lang=result.source_lang, target_lang=result.target_lang, route=result.route)
        if self.observer is not None:
            for k, v in result.latency_ms.items():
                self.observer.stage(k, v / 1000)
        return result

    def close(self) -> None:
        self.registry.close()
