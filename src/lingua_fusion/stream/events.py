"""What a stream says to its client: one class per event, each with one ``to_wire()``.

Fields marked internal (``INTERNAL``) carry what the engine needs about an event (when its words arrived, which
input it came from) and never reach the wire. Optional fields (``OPTIONAL``) are left out while they are None.
The wire format is documented in docs/streaming.md and docs/asyncapi.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from ..errors import LinguaFusionError

INTERNAL = {"internal": True}
OPTIONAL = {"optional": True}


def _opt() -> Any:
    return field(default=None, metadata=OPTIONAL)


@dataclass
class Event:
    TYPE: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE}
        for f in fields(self):
            if f.metadata.get("internal"):
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("optional"):
                continue
            out[f.name] = value
        return out


@dataclass
class Ready(Event):
    TYPE: ClassVar[str] = "ready"
    stream_id: str
    resume_token: str
    slo: str
    source_lang: str
    targets: list[str]
    partials: bool
    resumed: dict[str, Any] | None = field(default=None, metadata=INTERNAL)  # last_seq, resume_from(_ts)
    room_id: str | None = _opt()  # the stream is published as this room (start message "room")
    listener_token: str | None = _opt()  # read-only: listeners join the room with it (never the publisher's key)
    listener_token_id: str | None = _opt()  # that token's id: what the owner revokes it by
    max_audio_speed: float | None = _opt()  # the stream's audio budget (stream/budget.py): x real time, averaged
    max_audio_burst_s: float | None = _opt()  # ... in bursts of this many seconds (also the most per message)
    scripts: dict[str, str] | None = _opt()  # Chinese: the transcript's ("source") and each target's script
    source_langs: list[str] | None = _opt()  # source_lang "auto": the languages each utterance may be detected in
    max_speakers: int | None = _opt()  # diarize: finals carry speaker, at most this many speakers
    speaker_names: dict[str, str] | None = _opt()  # diarize: the names given so far (a resumed stream's too)

    def to_wire(self) -> dict[str, Any]:
        out = super().to_wire()
        if self.resumed is not None:
            out.update(resumed=True, **self.resumed)
        return out


@dataclass
class Partial(Event):
    """Tentative text of the utterance being spoken (and its tentative translation into the first target)."""

    TYPE: ClassVar[str] = "partial"
    start: float
    end: float
    source_text: str
    stable_text: str
    text: str
    confidence: float
    revision: int


@dataclass
class Revision(Partial):
    """A partial that does not extend the previous one: earlier words changed."""

    TYPE: ClassVar[str] = "revision"


@dataclass
class Final(Event):
    """A committed caption, numbered 1, 2, 3, ... with no gaps; logged before it is sent."""

    TYPE: ClassVar[str] = "final"
    start: float
    end: float
    source_text: str
    text: str
    translations: dict[str, str]
    confidence: float
    seq: int = 0
    slides: list[str] = field(default_factory=list)
    slide_terms: list[str] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    failed: list[str] | None = _opt()  # stages that failed after retries ("asr", "mt:es")
    gated: list[str] | None = _opt()  # stages whose output was withheld (confidence below the stream's minimum)
    note: str | None = _opt()
    durable: bool | None = _opt()  # False: sent before it was logged (the stream log was down)
    low_confidence: list[str] | None = _opt()  # targets the tiny LLM translated (check them: often wrong)
    untranslated: dict[str, list[str]] | None = _opt()  # per target, words MT left as written (no dictionary)
    replaced: list[list[str]] | None = _opt()  # [heard, lip-read] words the lips replaced (vision/stream_lips.py)
    # the finals (this one among them, by seq) whose translation was made as one sentence and cut back onto each:
    # an utterance cut at the maximum length mid-sentence and the one that finished it (stream/sentences.py)
    sentence: list[int] | None = _opt()
    scripts: dict[str, str] | None = _opt()  # Chinese: the script of source_text ("source") and of each target
    source_lang: str | None = _opt()  # the language of source_text (given, or detected on a "auto" stream)
    # a "auto" stream's: the detector's probability for source_lang among the stream's languages, and True when its
    # best guess scored under stream/languages.py SURE (source_lang is then the stream's previous language)
    source_lang_confidence: float | None = _opt()
    source_lang_unsure: bool | None = _opt()
    # a ``diarize`` stream's (stream/speakers.py): who spoke it, "S1", "S2", ... in order of appearance, stable within
    # the stream; how sure (0..1); and the name the publisher gave that speaker (``rename_speaker``), when named
    speaker: str | None = _opt()
    speaker_confidence: float | None = _opt()
    speaker_name: str | None = _opt()
    # a ``word_timestamps`` stream's: each spoken word of source_text, {word, start, end} in stream seconds, in order
    words: list[dict[str, Any]] | None = _opt()
    voice: Any = field(default=None, metadata=INTERNAL)  # stream/speakers.py Voice: its embedding, until labelled
    wall_ref: float = field(default=0.0, metadata=INTERNAL)  # when the words it captions arrived
    modality: str = field(default="audio", metadata=INTERNAL)  # audio | text | lips: which cursor it moves in the log
    cut: str = field(default="", metadata=INTERNAL)  # why its utterance ended: pause | length | end (stream/policy.py)
    # what contributed when more than its input did (speech confirmed or changed by lips: ["audio", "lips"])
    modalities: list[str] | None = field(default=None, metadata=INTERNAL)

    def to_wire(self) -> dict[str, Any]:
        out = super().to_wire()
        # what the caption was made from (``sign`` events: ["sign"])
        out["modalities"] = list(self.modalities or [self.modality])
        return out


@dataclass
class SpeakerRenamed(Event):
    """A ``diarize`` stream's speaker was given a display name (``rename_speaker``; ``name`` None: the name was
    taken away). ``names`` is every name given so far: a room's late listener gets the latest of these first."""

    TYPE: ClassVar[str] = "speaker_renamed"
    speaker: str
    name: str | None
    names: dict[str, str]


@dataclass
class Logged(Event):
    """A final read back from the stream log (a resume's replay): sent as it was logged."""

    body: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.body)


@dataclass
class Metrics(Event):
    TYPE: ClassVar[str] = "metrics"
    seq: int
    latency_ms: dict[str, float]
    queue_depth: dict[str, int]


@dataclass
class Slide(Event):
    """Words read on a slide: from an ``image`` message, or a change found in ``frame`` messages (video), which
    also carry the translation (rows in reading order: title first, then top to bottom; one per line)."""

    TYPE: ClassVar[str] = "slide"
    t: float  # stream time the slide appeared (it lasts until the next slide event)
    source_text: str
    text: str | None = _opt()  # translation into the first target (video frames)
    translations: dict[str, str] | None = _opt()  # every target
    lines: list[dict[str, Any]] | None = _opt()  # rows: source_text, title, translations
    settled_t: float | None = _opt()  # stream time it was judged settled and read (t + about 0.5 s)


@dataclass
class Sign(Event):
    """A sign recognised in a stream's video frames against the stream's taught vocabulary (vision/stream_signs.py),
    its gloss translated like any source text; on the stream's timeline from ``t`` to ``end``."""

    TYPE: ClassVar[str] = "sign"
    t: float
    end: float
    gloss: str
    confidence: float
    text: str  # translation into the first target
    translations: dict[str, str]
    modalities: list[str] = field(default_factory=lambda: ["sign"])
    frames: dict[str, int] | None = _opt()  # the stream's video frames so far: decoded, analysed for landmarks


@dataclass
class Speech(Event):
    TYPE: ClassVar[str] = "speech"
    seq: int
    lang: str
    audio_base64: str
    format: str = "wav"


@dataclass
class Error(Event):
    """A problem that does not end the stream (one bad message, a slide not read), or the reason it ended."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    details: dict[str, Any] | None = _opt()


@dataclass
class NotDurable(Event):
    TYPE: ClassVar[str] = "not_durable"
    from_seq: int
    message: str
    code: str = "state_store_unavailable"


@dataclass
class Durable(Event):
    TYPE: ClassVar[str] = "durable"
    through_seq: int


@dataclass
class Degraded(Event):
    """The SLO breaker moved this stream's class down its degradation ladder."""

    TYPE: ClassVar[str] = "degraded"
    slo: str
    level: int
    step: str
    stage: str
    window_p99_s: float | None


@dataclass
class Restored(Degraded):
    TYPE: ClassVar[str] = "restored"


@dataclass
class Closed(Event):
    TYPE: ClassVar[str] = "closed"
    finals: int
    reason: str = "end of stream"
    unlogged: int | None = _opt()  # finals sent but never logged (the log stayed down)
    frames_dropped: int | None = _opt()
    video: dict[str, Any] | None = _opt()  # frame messages: frames looked at, ocr_calls, superseded
    timeline: dict[str, Any] | None = _opt()


def error_event(exc: LinguaFusionError) -> Error:
    """What a client is told of an error: its code and the public message (never a path, address or secret)."""
    return Error(exc.code, exc.public_message, exc.details or None)
