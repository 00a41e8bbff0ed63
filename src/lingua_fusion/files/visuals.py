"""A video's frames on the file path: read into slides (and signs, with a vocabulary_id) before the speech, the
slide names that MT would mangle kept as written, then each slide row and sign gloss translated."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..config import Settings
from ..errors import UnsupportedPair
from ..glossary import Term
from ..models.base import OCRLine
from ..models.registry import Registry
from ..serving.ports import OcrInput
from ..types import Modality, Segment, SignText, SlideText
from .engine import EngineLink
from .mt import SegmentMT
from .validate import check_pair, identify
from .work import Stages, Work

if TYPE_CHECKING:
    from ..vision.file_signs import SignReader


class VideoVisuals:
    def __init__(self, settings: Settings, registry: Registry, mt: SegmentMT,
                 engine: Callable[[], EngineLink]) -> None:
        self.settings = settings
        self.registry = registry
        self.mt = mt
        self.engine = engine

    def read(self, data: bytes, work: Work, st: Stages, signs: SignReader | None = None) -> bool:
        """A video's frames -> its slides (``work.video``; their words become ASR prompts and MT names). Returns
        whether the file has an audio track to transcribe."""
        from ..video.fanout import FrameContext
        from ..video.file_video import read_video
        from ..video.slide_reader import MAX_READS

        link, call, lang = self.engine(), work.call, work.source

        def ocr(rgb: np.ndarray) -> list[OCRLine]:  # on the slide reader's own thread
            return link.read(OcrInput(rgb, lang), call)

        with st.stage("video"):
            video = read_video(data, self.settings, ocr, self.registry.ocr_name(),
                               FrameContext(work.source, work.target, self.settings, self.registry, signs),
                               deadline=st.deadline)
            work.signs = signs.finish() if signs is not None else []
        if not video.probe.has_video:
            return True
        work.video = video
        if video.slides:
            work.models["ocr"] = video.ocr_model
        else:
            work.warnings.append("no slide or whiteboard text was found in the video frames")
        if video.capped:
            work.warnings.append(f"the slide changed more than {MAX_READS} times: later slides were not read")
        if video.probe.has_audio:
            return True
        work.duration = video.probe.duration_s
        if video.slides and work.source is None:
            work.source, work.confidence = identify(" ".join(s.source_text for s in video.slides))
            work.detected = True
        return False

    def slide_names(self, work: Work, segs: list[Segment], glossary: list[Term]) -> list[Term]:
        """Names on the slides (acronyms, product names) that the speech says and that MT would mangle: each is
        translated alone once; one that comes back changed but spelt alike ("Acme" -> "Acmé") is kept as written,
        one that comes back unchanged needs nothing, and one translated for real ("Monday" -> "lunes") is left to MT
        (a protected term also changes the words around it: Apertium put "encima" for "on" before one)."""
        from difflib import SequenceMatcher

        if work.video is None or not work.slide_context or work.route is None:
            return []
        own = {t.source.lower() for t in glossary}
        said = " ".join(s.source_text for s in segs)
        names = [n for n in work.video.names()
                 if n.lower() not in own and re.search(rf"\b{re.escape(n)}\b", said)]
        if not names:
            return []
        probe = [Segment(start=0.0, end=0.0, source_text=n, text=n) for n in names]
        self.mt.translate(probe, work.route, [], {}, work.call)
        return [Term(n, n) for n, p in zip(names, probe, strict=True)
                if p.text.strip() != n and SequenceMatcher(None, n.lower(), p.text.strip().lower()).ratio() >= 0.6]

    def slides(self, work: Work, glossary: list[Term], tgt_mod: Modality, st: Stages) -> list[SlideText]:
        """The video's slides, each row translated (the same route and glossary as the speech), as results."""
        from ..video.file_video import slide_texts

        assert work.source is not None and work.video is not None
        route = work.route
        if work.speech_translation:  # Whisper translated the speech; the slides need a text pair of their own
            try:
                route = check_pair(self.registry, work.source, work.target)
            except UnsupportedPair:
                route = None
                work.warnings.append(f"slides were not translated: no model translates {work.source} -> "
                                     f"{work.target} text")

        def mt(rows: list[str]) -> list[str]:
            assert route is not None
            return self.mt.texts(rows, route, glossary, work.models, work.call, work.untranslated,
                                 work.target_script)

        braille = None
        if tgt_mod == Modality.BRAILLE:
            br = self.registry.braille()
            braille = lambda text: br.translate(text, language=work.target)  # noqa: E731
        with st.stage("slides_mt"):
            return slide_texts(work.video.slides, mt if route is not None else None, braille)

    def signs(self, reader: SignReader, work: Work, st: Stages) -> list[SignText]:
        """The video's known signs, each gloss translated from the vocabulary's language (``reader``: the request's
        vision/file_signs.py SignReader, which makes the results)."""
        route = None
        if reader.lang != work.target:
            try:
                route = check_pair(self.registry, reader.lang, work.target)
            except UnsupportedPair:
                work.warnings.append(f"signs were not translated: no model translates {reader.lang} -> {work.target}")

        def mt(texts: list[str]) -> list[str]:
            assert route is not None
            return self.mt.texts(texts, route, [], work.models, work.call, work.untranslated,
                                 work.target_script)

        with st.stage("signs_mt"):
            return reader.texts(work.signs, mt if route is not None else None)
