"""What a stream says to its client: one class per event, each with one ``to_wire()``.

Fields marked internal (``INTERNAL``) carry what the engine needs about an event (when its words arrived, which
input it came from) and never reach the wire. Optional fields (``OPTIONAL``) are left out while they are None.
The wire format is documented in docs/streaming.md and docs/asyncapi.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, cast

from ..errors import LinguaFusionError
from ..json_types import JSONObject, json_object
from .wire import (
    ClosedJSON,
    DegradedJSON,
    DurableJSON,
    ErrorJSON,
    FinalJSON,
    MetricsJSON,
    NotDurableJSON,
    PartialJSON,
    ReadyJSON,
    ResumedJSON,
    SignJSON,
    SlideJSON,
    SlideLineJSON,
    SpeakerRenamedJSON,
    SpeechJSON,
    TimelineStatsJSON,
    VideoStatsJSON,
    WireEvent,
    WordJSON,
)

INTERNAL = {"internal": True}
OPTIONAL = {"optional": True}  # field(default=None, metadata=OPTIONAL): left out of the wire while None


@dataclass
class Event:
    TYPE: ClassVar[str] = ""

    def to_wire(self) -> WireEvent:
        """The event on the wire: each event's own TypedDict (each subclass names it)."""
        raise NotImplementedError(type(self).__name__)

    def _wire(self) -> dict[str, object]:
        """The event's fields as they go on the wire, in the shape its TypedDict declares: the type first, then
        each field in order, internal ones never, optional ones only when set."""
        out: dict[str, object] = {"type": self.TYPE}
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
    resumed: ResumedJSON | None = field(default=None, metadata=INTERNAL)  # last_seq, resume_from(_ts)
    # the stream is published as this room (start message "room")
    room_id: str | None = field(default=None, metadata=OPTIONAL)
    # read-only: listeners join the room with it (never the publisher's key)
    listener_token: str | None = field(default=None, metadata=OPTIONAL)
    # that token's id: what the owner revokes it by
    listener_token_id: str | None = field(default=None, metadata=OPTIONAL)
    # the stream's audio budget (stream/budget.py): x real time, averaged
    max_audio_speed: float | None = field(default=None, metadata=OPTIONAL)
    # ... in bursts of this many seconds (also the most per message)
    max_audio_burst_s: float | None = field(default=None, metadata=OPTIONAL)
    # Chinese: the transcript's ("source") and each target's script
    scripts: dict[str, str] | None = field(default=None, metadata=OPTIONAL)
    # source_lang "auto": the languages each utterance may be detected in
    source_langs: list[str] | None = field(default=None, metadata=OPTIONAL)
    # diarize: finals carry speaker, at most this many speakers
    max_speakers: int | None = field(default=None, metadata=OPTIONAL)
    # diarize: the names given so far (a resumed stream's too)
    speaker_names: dict[str, str] | None = field(default=None, metadata=OPTIONAL)

    def to_wire(self) -> ReadyJSON:
        out = cast(ReadyJSON, self._wire())
        if self.resumed is not None:
            out["resumed"] = True
            out["last_seq"] = self.resumed["last_seq"]
            out["resume_from"] = self.resumed["resume_from"]
            out["resume_from_ts"] = self.resumed["resume_from_ts"]
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

    def to_wire(self) -> PartialJSON:
        return cast(PartialJSON, self._wire())


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
    # stages that failed after retries ("asr", "mt:es")
    failed: list[str] | None = field(default=None, metadata=OPTIONAL)
    # stages whose output was withheld (confidence below the stream's minimum)
    gated: list[str] | None = field(default=None, metadata=OPTIONAL)
    note: str | None = field(default=None, metadata=OPTIONAL)
    # False: sent before it was logged (the stream log was down)
    durable: bool | None = field(default=None, metadata=OPTIONAL)
    # targets the tiny LLM translated (check them: often wrong)
    low_confidence: list[str] | None = field(default=None, metadata=OPTIONAL)
    # per target, words MT left as written (no dictionary)
    untranslated: dict[str, list[str]] | None = field(default=None, metadata=OPTIONAL)
    # [heard, lip-read] words the lips replaced (vision/stream_lips.py)
    replaced: list[list[str]] | None = field(default=None, metadata=OPTIONAL)
    # the finals (this one among them, by seq) whose translation was made as one sentence and cut back onto each:
    # an utterance cut at the maximum length mid-sentence and the one that finished it (stream/finals.py)
    sentence: list[int] | None = field(default=None, metadata=OPTIONAL)
    # Chinese: the script of source_text ("source") and of each target
    scripts: dict[str, str] | None = field(default=None, metadata=OPTIONAL)
    # the language of source_text (given, or detected on a "auto" stream)
    source_lang: str | None = field(default=None, metadata=OPTIONAL)
    # a "auto" stream's: the detector's probability for source_lang among the stream's languages, and True when its
    # best guess scored under stream/languages.py SURE (source_lang is then the stream's previous language)
    source_lang_confidence: float | None = field(default=None, metadata=OPTIONAL)
    source_lang_unsure: bool | None = field(default=None, metadata=OPTIONAL)
    # a ``diarize`` stream's (stream/speakers.py): who spoke it, "S1", "S2", ... in order of appearance, stable within
    # the stream; how sure (0..1); and the name the publisher gave that speaker (``rename_speaker``), when named
    speaker: str | None = field(default=None, metadata=OPTIONAL)
    speaker_confidence: float | None = field(default=None, metadata=OPTIONAL)
    speaker_name: str | None = field(default=None, metadata=OPTIONAL)
    # a ``word_timestamps`` stream's: each spoken word of source_text, {word, start, end} in stream seconds, in order
    words: list[WordJSON] | None = field(default=None, metadata=OPTIONAL)
    voice: object = field(default=None, metadata=INTERNAL)  # stream/speakers.py Voice: its embedding, until labelled
    wall_ref: float = field(default=0.0, metadata=INTERNAL)  # when the words it captions arrived
    modality: str = field(default="audio", metadata=INTERNAL)  # audio | text | lips: which cursor it moves in the log
    cut: str = field(default="", metadata=INTERNAL)  # why its utterance ended: pause | length | end (stream/policy.py)
    # what contributed when more than its input did (speech confirmed or changed by lips: ["audio", "lips"])
    modalities: list[str] | None = field(default=None, metadata=INTERNAL)

    def to_wire(self) -> FinalJSON:
        out = cast(FinalJSON, self._wire())
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

    def to_wire(self) -> SpeakerRenamedJSON:
        return cast(SpeakerRenamedJSON, self._wire())


@dataclass
class Logged(Event):
    """A final read back from the stream log (a resume's replay): sent as it was logged."""

    body: FinalJSON

    def to_wire(self) -> FinalJSON:
        return self.body.copy()


@dataclass
class Metrics(Event):
    TYPE: ClassVar[str] = "metrics"
    seq: int
    latency_ms: dict[str, float]
    queue_depth: dict[str, int]

    def to_wire(self) -> MetricsJSON:
        return cast(MetricsJSON, self._wire())


@dataclass
class Slide(Event):
    """Words read on a slide: from an ``image`` message, or a change found in ``frame`` messages (video), which
    also carry the translation (rows in reading order: title first, then top to bottom; one per line)."""

    TYPE: ClassVar[str] = "slide"
    t: float  # stream time the slide appeared (it lasts until the next slide event)
    source_text: str
    text: str | None = field(default=None, metadata=OPTIONAL)  # translation into the first target (video frames)
    translations: dict[str, str] | None = field(default=None, metadata=OPTIONAL)  # every target
    lines: list[SlideLineJSON] | None = field(default=None, metadata=OPTIONAL)  # rows: source_text, title, translations
    # stream time it was judged settled and read (t + about 0.5 s)
    settled_t: float | None = field(default=None, metadata=OPTIONAL)

    def to_wire(self) -> SlideJSON:
        return cast(SlideJSON, self._wire())


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
    # the stream's video frames so far: decoded, analysed for landmarks
    frames: dict[str, int] | None = field(default=None, metadata=OPTIONAL)

    def to_wire(self) -> SignJSON:
        return cast(SignJSON, self._wire())


@dataclass
class Speech(Event):
    TYPE: ClassVar[str] = "speech"
    seq: int
    lang: str
    audio_base64: str
    format: str = "wav"

    def to_wire(self) -> SpeechJSON:
        return cast(SpeechJSON, self._wire())


@dataclass
class Error(Event):
    """A problem that does not end the stream (one bad message, a slide not read), or the reason it ended."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    details: JSONObject | None = field(default=None, metadata=OPTIONAL)

    def to_wire(self) -> ErrorJSON:
        return cast(ErrorJSON, self._wire())


@dataclass
class NotDurable(Event):
    TYPE: ClassVar[str] = "not_durable"
    from_seq: int
    message: str
    code: str = "state_store_unavailable"

    def to_wire(self) -> NotDurableJSON:
        return cast(NotDurableJSON, self._wire())


@dataclass
class Durable(Event):
    TYPE: ClassVar[str] = "durable"
    through_seq: int

    def to_wire(self) -> DurableJSON:
        return cast(DurableJSON, self._wire())


@dataclass
class Degraded(Event):
    """The SLO breaker moved this stream's class down its degradation ladder."""

    TYPE: ClassVar[str] = "degraded"
    slo: str
    level: int
    step: str
    stage: str
    window_p99_s: float | None

    def to_wire(self) -> DegradedJSON:
        return cast(DegradedJSON, self._wire())


@dataclass
class Restored(Degraded):
    TYPE: ClassVar[str] = "restored"


@dataclass
class Closed(Event):
    TYPE: ClassVar[str] = "closed"
    finals: int
    reason: str = "end of stream"
    unlogged: int | None = field(default=None, metadata=OPTIONAL)  # finals sent but never logged (the log stayed down)
    frames_dropped: int | None = field(default=None, metadata=OPTIONAL)
    # frame messages: frames looked at, ocr_calls, superseded
    video: VideoStatsJSON | None = field(default=None, metadata=OPTIONAL)
    timeline: TimelineStatsJSON | None = field(default=None, metadata=OPTIONAL)

    def to_wire(self) -> ClosedJSON:
        return cast(ClosedJSON, self._wire())


def error_event(exc: LinguaFusionError) -> Error:
    """What a client is told of an error: its code and the public message (never a path, address or secret)."""
    return Error(exc.code, exc.public_message, json_object(exc.details) if exc.details else None)
