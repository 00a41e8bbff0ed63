"""What the REST routes, the SDK's local mode and the CLI share: landmarks from a video's bytes, and glosses
recognised on a timeline. Blocking (PyAV, the worker, DTW): callers run it off the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from ..config import Settings
from ..deadline import Deadline
from ..errors import InvalidParameter, NoContent
from ..video.frames import VideoFrame
from .extractor import MediapipeExtractor
from .landmarks import MAX_FRAMES, LandmarkExtractor, LandmarkSeq
from .recogniser import Recogniser, Recognition
from .segment import Span, sign_spans
from .vocab_port import VocabularyBackend

PARTS = {"sign": frozenset({"hands"}), "lip": frozenset({"lips"})}


class CandidateJSON(TypedDict):
    gloss: str
    distance: float


class GlossSpanJSON(TypedDict):
    """One recognised span as the API shows it (``GlossSpan.to_dict``)."""

    start: float
    end: float
    gloss: str
    confidence: float
    distance: float
    nearest: str
    candidates: list[CandidateJSON]
    text: str | None


class RecognitionJSON(TypedDict):
    """The answer of a recognition (``recognition_body``)."""

    vocabulary_id: str
    kind: str
    frames: int
    modalities: list[str]
    source_text: str
    text: str | None
    glosses: list[GlossSpanJSON]


@dataclass(frozen=True)
class GlossSpan:
    """One recognised sign or lip word on the media timeline; ``text`` its translation (None: not asked)."""

    start: float
    end: float
    recognition: Recognition
    text: str | None = None

    def to_dict(self) -> GlossSpanJSON:
        r = self.recognition
        return {"start": round(self.start, 3), "end": round(self.end, 3), "gloss": r.gloss,
                "confidence": r.confidence, "distance": r.distance, "nearest": r.nearest,
                "candidates": [{"gloss": g, "distance": d} for g, d in r.candidates], "text": self.text}


class _Enough(Exception):
    """Raised from the frame callback to stop decoding at the example length limit."""


class VisionService:
    def __init__(self, settings: Settings, store: VocabularyBackend,
                 extractor: Callable[[], LandmarkExtractor] | None = None) -> None:
        self.settings = settings
        self.store = store
        self._make = extractor or self._mediapipe
        self._extractor: LandmarkExtractor | None = None
        self._lock = threading.Lock()
        # live streams' extraction calls run here, one at a time (the worker takes one request at a time anyway):
        # streams waiting for the extractor hold this pool's queue, not the event loop's default threads
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vision")

    def _mediapipe(self) -> LandmarkExtractor:
        v = self.settings.vision
        return MediapipeExtractor(v.python, timeout_s=v.timeout_s, start_timeout_s=v.start_timeout_s,
                                  max_side=v.max_side, session="files")

    def extractor(self) -> LandmarkExtractor:
        with self._lock:
            if self._extractor is None:
                self._extractor = self._make()
            return self._extractor

    def landmarks_from_video(self, data: bytes, kind: str, deadline: Deadline | None = None) -> LandmarkSeq:
        """The landmarks (hands for signs, lips for lip words) of a video's first ``max_example_seconds``."""
        from ..video.decode import decode_frames

        v = self.settings.vision
        frames: list[tuple[float, np.ndarray]] = []
        limit = min(MAX_FRAMES, int(v.max_example_seconds * v.example_fps) + 1)

        def keep(frame: VideoFrame) -> None:
            if frame.t > v.max_example_seconds or len(frames) >= limit:
                raise _Enough
            frames.append((frame.t, frame.rgb))

        try:
            decode_frames(data, self.settings.limits, keep, fps=v.example_fps, max_side=v.max_side,
                          deadline=deadline)
        except _Enough:
            pass
        if not frames:
            raise NoContent("the video has no frames to read landmarks from")
        seq = LandmarkSeq.from_frames(self.extractor().extract(frames, parts=PARTS[kind]))
        if kind == "sign" and not seq.hand_mask.any():
            raise NoContent("no hand was found in the video's frames", details={"frames": len(seq)})
        if kind == "lip" and not seq.lips_mask.any():
            raise NoContent("no face (lips) was found in the video's frames", details={"frames": len(seq)})
        return seq

    def recognise(self, owner: str, vocab_id: str, seq: LandmarkSeq,
                  translate: Callable[[str], str] | None = None) -> list[GlossSpan]:
        """Signs: each run of frames with a hand in view is one sign; lips: the whole sequence is one word."""
        rec: Recogniser = self.store.recogniser(owner, vocab_id)
        if rec.kind == "sign":
            spans = sign_spans(seq)
            if not spans:
                raise NoContent("no sign was found: no run of frames with a hand in view")
        else:
            if len(seq) < 2:
                raise InvalidParameter("a lip word needs at least 2 frames", details={"field": "frames"})
            spans = [Span(float(seq.t[0]), float(seq.t[-1]))]
        out = []
        texts: dict[str, str] = {}
        for span in spans:
            window = seq.window(span.start, span.end)
            assert window is not None
            r = rec.recognise(window)
            text = None
            if translate is not None and r.known:
                if r.gloss not in texts:
                    texts[r.gloss] = translate(gloss_text(r.gloss))
                text = texts[r.gloss]
            out.append(GlossSpan(span.start, span.end, r, text))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._extractor is not None:
                self._extractor.close()
                self._extractor = None


def recognition_body(vocab_id: str, kind: str, frames: int, spans: list[GlossSpan], translated: bool
                     ) -> RecognitionJSON:
    """The answer of a recognition (REST and the SDK's local mode): every span, and the known glosses as one
    source text with its translation."""
    known = [s for s in spans if s.recognition.known]
    return {"vocabulary_id": vocab_id, "kind": kind, "frames": frames,
            "modalities": ["sign" if kind == "sign" else "lips"],
            "source_text": " ".join(s.recognition.gloss for s in known),
            "text": " ".join(s.text or "" for s in known).strip() if translated else None,
            "glosses": [s.to_dict() for s in spans]}


def gloss_text(gloss: str) -> str:
    """A gloss as source text for MT: THANK-YOU -> "thank you"."""
    return " ".join(gloss.replace("-", " ").replace("_", " ").split()).lower()
