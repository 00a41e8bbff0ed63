"""A video file's signs, read with the request key's sign vocabulary: the landmarks ``FrameConsumer`` the file path
attaches to its frame fan-out (``video.fanout.FILE_CONSUMERS["signs"]``) when a request names a ``vocabulary_id``.

``SignReader`` is made per request (``reader``: the key's own vocabulary, taught, of kind ``sign``; another key's is
``not_found``). The file path decodes in a worker thread, so ``offer`` works synchronously: the adaptive sampler
(``sampler.py``, a budget as for a stream) picks frames, which are extracted in batches of ``BATCH`` (the worker's
hand tracking kept for the file's session). ``finish`` cuts the hands' landmarks into signs (``segment.sign_spans``)
and recognises each; ``sign_texts`` translates the known glosses into the result's ``signs`` timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidParameter
from ..types import SignText
from ..video.fanout import FILE_CONSUMERS, FrameContext, Tap
from ..video.frames import FrameStats, VideoFrame
from .landmarks import MAX_FRAMES, LandmarkExtractor, LandmarkFrame, LandmarkSeq
from .recogniser import Recogniser
from .sampler import AdaptiveSampler, SamplingPolicy
from .segment import sign_spans
from .service import GlossSpan, gloss_text

if TYPE_CHECKING:
    from .service import VisionService

BATCH = 8  # frames per request to the worker
FILE_FPS = 15.0  # the most frames a second the decoder hands over for signs
FILE_SAMPLING = SamplingPolicy(min_fps=4.0, max_fps=15.0, budget_fps=12.0, burst=8.0)


class SignReader:
    """One request's signs: a FrameConsumer, then ``finish()`` -> recognised spans (known or not)."""

    def __init__(self, recogniser: Recogniser, extractor: LandmarkExtractor, lang: str, vocabulary_id: str,
                 session: str) -> None:
        self.recogniser = recogniser
        self.extractor = extractor
        self.lang = lang  # the glosses' language: what MT translates them from
        self.vocabulary_id = vocabulary_id
        self.session = session
        self.sampler = AdaptiveSampler(FILE_SAMPLING)
        self._batch: list[tuple[float, np.ndarray]] = []
        self.frames: list[LandmarkFrame] = []

    # ---- FrameConsumer (the file's decoding thread) ----------------------------------------------------------
    def offer(self, frame: VideoFrame) -> None:
        if len(self.frames) + len(self._batch) >= MAX_FRAMES or not self.sampler.offer(frame.t, frame.rgb):
            return
        self._batch.append((frame.t, frame.rgb))
        if len(self._batch) >= BATCH:
            self._flush()

    def stats(self) -> FrameStats:
        return self.sampler.stats()

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        for lm in self.extractor.extract(batch, parts=frozenset({"hands"}), session=self.session):
            self.sampler.observe(lm)
            self.frames.append(lm)

    def finish(self) -> list[GlossSpan]:
        """Every sign in the frames read: a run of frames with a hand in view, recognised."""
        self._flush()
        if not self.frames:
            return []
        seq = LandmarkSeq.from_frames(self.frames)
        out = []
        for span in sign_spans(seq):
            window = seq.window(span.start, span.end)
            if window is not None and window.hand_mask.any(axis=1).sum() >= 2:
                out.append(GlossSpan(span.start, span.end, self.recogniser.recognise(window)))
        return out

    def texts(self, spans: list[GlossSpan], translate: Callable[[list[str]], list[str]] | None) -> list[SignText]:
        """``sign_texts``: how files/ turns what it read into results without importing vision/."""
        return sign_texts(spans, translate)


def reader(vision: VisionService | None, owner: str, vocabulary_id: object, request_id: str) -> SignReader:
    """The request's reader: ``owner``'s sign vocabulary (not_found for another key's, invalid_parameter for an
    untaught one, a lip vocabulary, or a server without vision)."""
    if not isinstance(vocabulary_id, str) or not vocabulary_id:
        raise InvalidParameter("vocabulary_id must be a vocabulary's id (POST /v1/vocabularies)",
                               details={"field": "vocabulary_id"})
    if vision is None:
        raise InvalidParameter("this server reads no signs: it has no vocabulary store",
                               details={"field": "vocabulary_id"})
    vocab = vision.store.get(owner, vocabulary_id)
    if vocab.kind != "sign":
        raise InvalidParameter(f"vocabulary {vocabulary_id} is a {vocab.kind} vocabulary: a file's video is read "
                               "for signs (lip words are fused with speech in live streams)",
                               details={"field": "vocabulary_id"})
    rec = vision.store.recogniser(owner, vocabulary_id)
    return SignReader(rec, vision.extractor(), vocab.lang, vocabulary_id, f"file-{request_id}")


def _tap(ctx: FrameContext) -> Tap | None:
    return Tap("signs", ctx.signs, fps=FILE_FPS) if isinstance(ctx.signs, SignReader) else None


FILE_CONSUMERS["signs"] = _tap


def sign_texts(spans: list[GlossSpan], translate: Callable[[list[str]], list[str]] | None) -> list[SignText]:
    """The known signs as results on the file's timeline, each gloss translated (one call for all of them)."""
    known = [s for s in spans if s.recognition.known]
    sources = [gloss_text(s.recognition.gloss) for s in known]
    texts = translate(sources) if translate is not None and sources else sources
    return [SignText(start=round(s.start, 3), end=round(s.end, 3), gloss=s.recognition.gloss, source_text=src,
                     text=text, confidence=s.recognition.confidence)
            for s, src, text in zip(known, sources, texts, strict=True)]
