"""A stream's events as they are sent: one TypedDict per event, the JSON ``to_wire()`` gives (stream/events.py),
keys in the order they are sent. docs/streaming.md and docs/asyncapi.yaml document the same shapes;
tests/unit/test_unit_stream_wire.py holds each event's ``to_wire()`` to its TypedDict."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from ..json_types import JSONObject


class ResumedJSON(TypedDict):
    """A resumed stream's ``ready`` adds these (stream/resume.py): the last final logged, where to re-send from."""

    last_seq: int
    resume_from: float
    resume_from_ts: float | None


class ReadyJSON(TypedDict):
    type: Literal["ready"]
    stream_id: str
    resume_token: str
    slo: str
    source_lang: str
    targets: list[str]
    partials: bool
    room_id: NotRequired[str]
    listener_token: NotRequired[str]
    listener_token_id: NotRequired[str]
    max_audio_speed: NotRequired[float]
    max_audio_burst_s: NotRequired[float]
    scripts: NotRequired[dict[str, str]]
    source_langs: NotRequired[list[str]]
    max_speakers: NotRequired[int]
    speaker_names: NotRequired[dict[str, str]]
    resumed: NotRequired[bool]  # then ResumedJSON's keys too
    last_seq: NotRequired[int]
    resume_from: NotRequired[float]
    resume_from_ts: NotRequired[float | None]


class PartialJSON(TypedDict):
    type: Literal["partial", "revision"]
    start: float
    end: float
    source_text: str
    stable_text: str
    text: str
    confidence: float
    revision: int


class WordJSON(TypedDict):
    """A ``word_timestamps`` final's spoken word, in stream seconds."""

    word: str
    start: float
    end: float


class FinalJSON(TypedDict):
    type: Literal["final"]
    start: float
    end: float
    source_text: str
    text: str
    translations: dict[str, str]
    confidence: float
    seq: int
    slides: list[str]
    slide_terms: list[str]
    latency_ms: dict[str, float]
    failed: NotRequired[list[str]]
    gated: NotRequired[list[str]]
    note: NotRequired[str]
    durable: NotRequired[bool]
    low_confidence: NotRequired[list[str]]
    untranslated: NotRequired[dict[str, list[str]]]
    replaced: NotRequired[list[list[str]]]
    sentence: NotRequired[list[int]]
    scripts: NotRequired[dict[str, str]]
    source_lang: NotRequired[str]
    source_lang_confidence: NotRequired[float]
    source_lang_unsure: NotRequired[bool]
    speaker: NotRequired[str]
    speaker_confidence: NotRequired[float]
    speaker_name: NotRequired[str]
    words: NotRequired[list[WordJSON]]
    modalities: list[str]


class SpeakerRenamedJSON(TypedDict):
    type: Literal["speaker_renamed"]
    speaker: str
    name: str | None
    names: dict[str, str]


class MetricsJSON(TypedDict):
    type: Literal["metrics"]
    seq: int
    latency_ms: dict[str, float]
    queue_depth: dict[str, int]


class SlideLineJSON(TypedDict):
    """A video slide's row: its text, whether it is the title, and its translation into each target."""

    source_text: str
    title: bool
    translations: dict[str, str]


class SlideJSON(TypedDict):
    type: Literal["slide"]
    t: float
    source_text: str
    text: NotRequired[str]
    translations: NotRequired[dict[str, str]]
    lines: NotRequired[list[SlideLineJSON]]
    settled_t: NotRequired[float]


class SignJSON(TypedDict):
    type: Literal["sign"]
    t: float
    end: float
    gloss: str
    confidence: float
    text: str
    translations: dict[str, str]
    modalities: list[str]
    frames: NotRequired[dict[str, int]]


class SpeechJSON(TypedDict):
    type: Literal["speech"]
    seq: int
    lang: str
    audio_base64: str
    format: str


class ErrorJSON(TypedDict):
    type: Literal["error"]
    code: str
    message: str
    details: NotRequired[JSONObject]


class NotDurableJSON(TypedDict):
    type: Literal["not_durable"]
    from_seq: int
    message: str
    code: str


class DurableJSON(TypedDict):
    type: Literal["durable"]
    through_seq: int


class DegradedJSON(TypedDict):
    type: Literal["degraded", "restored"]
    slo: str
    level: int
    step: str
    stage: str
    window_p99_s: float | None


class VideoStatsJSON(TypedDict):
    """A closed stream's frame messages: frames looked at, OCR calls, settled changes superseded unread."""

    frames: int
    ocr_calls: int
    superseded: int


class TimelineStatsJSON(TypedDict):
    late_dropped: int
    reordered: int
    overlapped: int
    gap_seconds: float


class ClosedJSON(TypedDict):
    type: Literal["closed"]
    finals: int
    reason: str
    unlogged: NotRequired[int]
    frames_dropped: NotRequired[int]
    video: NotRequired[VideoStatsJSON]
    timeline: NotRequired[TimelineStatsJSON]


WireEvent = (ReadyJSON | PartialJSON | FinalJSON | SpeakerRenamedJSON | MetricsJSON | SlideJSON | SignJSON
             | SpeechJSON | ErrorJSON | NotDurableJSON | DurableJSON | DegradedJSON | ClosedJSON)
