"""OpenAI Realtime transcription sessions on the wire: the session's configuration (parsed from ``session.update``
/ ``transcription_session.update``, written back in ``*.created`` / ``*.updated``) and the server events.

Two dialects of the same session: the GA API (``session.created`` / ``session.updated``, the session nested as
``{"type": "transcription", "audio": {"input": {...}}}``) and the beta API that a client asking with
``OpenAI-Beta: realtime=v1`` speaks (``transcription_session.created`` / ``.updated``, flat
``input_audio_format`` / ``input_audio_transcription`` / ``turn_detection``). Both are read from either message.

Extensions (documented in docs/openai.md), under ``session.linguafusion``: ``target_languages`` (translations of
each transcript, sent as ``conversation.item.input_audio_translation.delta`` / ``.completed``), ``glossary_id``,
``slo``. Every server event gets an ``event_id``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Final, Literal, NotRequired, TypedDict, overload

from ..errors import InvalidParameter
from ..json_types import JSONObject
from ..serving.ports import SLO_CLASSES
from ..stream.protocol import MAX_TARGETS, POLICIES
from .openai_compat import OpenAIError, SpeechModel, language_code, live_model
from .openai_realtime_audio import BETA_FORMATS, FORMATS

Dialect = Literal["ga", "beta"]
GA: Final = "ga"
BETA: Final = "beta"
TRANSLATION_DELTA = "conversation.item.input_audio_translation.delta"
TRANSLATION_COMPLETED = "conversation.item.input_audio_translation.completed"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


# ---- the session on the wire (``session`` of session.created / .updated, transcription_session.*) ------------
class TranscriptionWire(TypedDict):
    model: str
    language: str | None
    prompt: str


class TurnDetectionWire(TypedDict):
    type: str
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int


class ExtensionWire(TypedDict):
    """``session.linguafusion``: the session's extensions as served (docs/openai.md)."""

    target_languages: list[str]
    glossary_id: str | None
    slo: str
    language_used: str


class FormatWire(TypedDict):
    type: str
    rate: NotRequired[int]  # audio/pcm's only


class AudioInputWire(TypedDict):
    format: FormatWire
    transcription: TranscriptionWire
    noise_reduction: None
    turn_detection: TurnDetectionWire | None


class AudioWire(TypedDict):
    input: AudioInputWire


class GASession(TypedDict):
    type: str
    id: str
    object: str
    audio: AudioWire
    include: list[str]
    linguafusion: ExtensionWire


class BetaSession(TypedDict):
    id: str
    object: str
    input_audio_format: str
    input_audio_transcription: TranscriptionWire
    turn_detection: TurnDetectionWire | None
    input_audio_noise_reduction: None
    include: list[str]
    linguafusion: ExtensionWire


@dataclass(frozen=True)
class SessionConfig:
    """A realtime transcription session's settings. ``turn_detection`` False: the client commits (no VAD events,
    one item per commit); True: the server's VAD cuts items (``server_vad``; ``semantic_vad`` is served as it)."""

    model: SpeechModel = field(default_factory=lambda: SpeechModel("whisper-1"))
    language: str | None = None  # None: English (streams do not detect the language; set it)
    prompt: str = ""
    format: str = "audio/pcm"
    rate: int = 24000
    turn_detection: bool = True
    targets: tuple[str, ...] = ()
    glossary_id: str | None = None
    slo: str = "standard"
    id: str = field(default_factory=lambda: new_id("sess"))

    @property
    def source(self) -> str:
        return self.language or "en"

    def start_message(self) -> dict[str, object]:
        """The stream start message (stream/protocol.py) that serves this session."""
        msg: dict[str, object] = {"type": "start", "source_lang": self.source,
                               "target_langs": list(self.targets) or [self.source], "slo": self.slo,
                               "partials": True, "inputs": ["audio"]}
        if self.glossary_id:
            msg["glossary_id"] = self.glossary_id
        return msg

    def stream_shape(self) -> tuple[str, tuple[str, ...], str | None, str, bool]:
        """What an open stream was built from: a change takes effect with the next stream (after a commit)."""
        return self.source, self.targets, self.glossary_id, self.slo, self.turn_detection

    # ---- reading an update -------------------------------------------------------------------------------------
    def updated(self, session: object) -> SessionConfig:
        """This config with the fields present in ``session`` changed (OpenAI's partial-update rule)."""
        if not isinstance(session, dict):
            raise InvalidParameter("session must be an object", details={"field": "session"})
        kind = session.get("type", "transcription")
        if kind != "transcription":
            raise InvalidParameter("this server serves transcription sessions only (session.type "
                                   "'transcription'); it has no speech-to-speech model", details={"field": "type"})
        new = self
        audio_in = _dict(_dict(session.get("audio"), "audio").get("input"), "audio.input")
        if "format" in audio_in:
            new = new._format(audio_in["format"])
        if "input_audio_format" in session:
            fmt = session["input_audio_format"]
            if not isinstance(fmt, str) or fmt not in BETA_FORMATS:
                raise InvalidParameter(f"input_audio_format must be one of {', '.join(BETA_FORMATS)}",
                                       details={"field": "input_audio_format"})
            new = replace(new, format=BETA_FORMATS[fmt], rate=FORMATS[BETA_FORMATS[fmt]])
        for key, value in (("audio.input.transcription", audio_in.get("transcription", ...)),
                           ("input_audio_transcription", session.get("input_audio_transcription", ...))):
            if value is not ...:
                new = new._transcription(value, key)
        for value in (audio_in.get("turn_detection", ...), session.get("turn_detection", ...)):
            if value is not ...:
                new = replace(new, turn_detection=_turn_detection(value))
        if "linguafusion" in session:
            new = new._extension(_dict(session["linguafusion"], "linguafusion"))
        return new

    def _format(self, value: object) -> SessionConfig:
        fmt = _dict(value, "audio.input.format")
        kind = fmt.get("type", "audio/pcm")
        if not isinstance(kind, str) or kind not in FORMATS:
            raise InvalidParameter(f"audio.input.format.type must be one of {', '.join(FORMATS)}",
                                   details={"field": "audio.input.format"})
        rate = fmt.get("rate") or FORMATS[kind]
        # only the rates each format is defined at: any other rate would size the resampler's filter (and the
        # work of every append) by the rate's ratio to 16 kHz, so 8001 Hz G.711 held the event loop for hours
        allowed = (24000, 16000) if kind == "audio/pcm" else (FORMATS[kind],)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate not in allowed:
            raise InvalidParameter(f"{kind} takes rate {' or '.join(map(str, allowed))}",
                                   details={"field": "audio.input.format.rate"})
        return replace(self, format=kind, rate=int(rate))

    def _transcription(self, value: object, where: str) -> SessionConfig:
        if value is None:
            return replace(self, model=SpeechModel("whisper-1"), language=None, prompt="")
        t = _dict(value, where)
        name = t.get("model")
        if name is not None and not isinstance(name, str):
            raise InvalidParameter("transcription.model must be a string", details={"field": "model"})
        model = live_model(name, field="model") if name else self.model
        language = language_code(t["language"], field="language") if "language" in t else self.language
        return replace(self, model=model, language=model.language(language),
                       prompt=str(t.get("prompt") or "") if "prompt" in t else self.prompt)

    def _extension(self, ext: dict[str, object]) -> SessionConfig:
        new = self
        if "target_languages" in ext:
            raw = ext["target_languages"] or []
            if not isinstance(raw, list) or len(raw) > MAX_TARGETS:
                raise InvalidParameter(f"linguafusion.target_languages lists 0 to {MAX_TARGETS} languages",
                                       details={"field": "target_languages"})
            targets = [language_code(t, field="target_languages") for t in raw]
            new = replace(new, targets=tuple(t for t in targets if t))
        if "glossary_id" in ext:
            new = replace(new, glossary_id=str(ext["glossary_id"]) if ext["glossary_id"] else None)
        if "slo" in ext:
            slo = ext["slo"]
            if not isinstance(slo, str) or slo not in SLO_CLASSES:
                raise InvalidParameter(f"linguafusion.slo must be one of {sorted(SLO_CLASSES)}",
                                       details={"field": "slo"})
            new = replace(new, slo=slo)
        return new

    # ---- writing it back ---------------------------------------------------------------------------------------
    def turn_detection_wire(self) -> TurnDetectionWire | None:
        """The effective VAD settings (the SLO class's commit policy; a client's own values are not used)."""
        if not self.turn_detection:
            return None
        policy = POLICIES[self.slo]
        return {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                "silence_duration_ms": int(policy.eou_silence_s * 1000)}

    def extension_wire(self) -> ExtensionWire:
        return {"target_languages": list(self.targets), "glossary_id": self.glossary_id, "slo": self.slo,
                "language_used": self.source}

    @overload
    def to_wire(self, dialect: Literal["ga"]) -> GASession: ...
    @overload
    def to_wire(self, dialect: Literal["beta"]) -> BetaSession: ...
    def to_wire(self, dialect: Dialect) -> GASession | BetaSession:
        transcription: TranscriptionWire = {"model": self.model.name, "language": self.language, "prompt": self.prompt}
        if dialect == BETA:
            beta_format = next(k for k, v in BETA_FORMATS.items() if v == self.format)
            return {"id": self.id, "object": "realtime.transcription_session", "input_audio_format": beta_format,
                    "input_audio_transcription": transcription, "turn_detection": self.turn_detection_wire(),
                    "input_audio_noise_reduction": None, "include": [], "linguafusion": self.extension_wire()}
        fmt: FormatWire = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = self.rate
        return {"type": "transcription", "id": self.id, "object": "realtime.transcription_session",
                "audio": {"input": {"format": fmt, "transcription": transcription, "noise_reduction": None,
                                    "turn_detection": self.turn_detection_wire()}},
                "include": [], "linguafusion": self.extension_wire()}


def _dict(value: object, where: str) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParameter(f"{where} must be an object", details={"field": where})
    return value


def _turn_detection(value: object) -> bool:
    if value is None:
        return False
    kind = _dict(value, "turn_detection").get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise InvalidParameter("turn_detection.type must be server_vad or semantic_vad (or null)",
                               details={"field": "turn_detection"})
    return True


# ---- server events ---------------------------------------------------------------------------------------------
class ServerEvent(TypedDict):
    """What every server event has: its ``type`` and an ``event_id`` of its own."""

    type: str
    event_id: str


class SessionEvent(ServerEvent):  # session.created / .updated, transcription_session.created / .updated
    session: GASession | BetaSession


class RealtimeError(OpenAIError):
    event_id: str | None  # the client event this error answers (None: not one event's)


class ErrorEvent(ServerEvent):
    error: OpenAIError


class SpeechStarted(ServerEvent):
    item_id: str
    audio_start_ms: int


class SpeechStopped(ServerEvent):
    item_id: str
    audio_end_ms: int


class Committed(ServerEvent):
    item_id: str
    previous_item_id: str | None


class TranscriptionDelta(ServerEvent):
    item_id: str
    content_index: int
    delta: str


class Usage(TypedDict):
    type: str
    seconds: float


class ItemExtension(TypedDict):
    """``linguafusion`` of a completed transcription: the stream and finals it came from; with the server's VAD,
    the item's times and its last final's flags (stream/events.py Final)."""

    stream_id: str
    finals: list[int]
    start_s: NotRequired[float]
    end_s: NotRequired[float]
    confidence: NotRequired[float]
    gated: NotRequired[list[str]]
    note: NotRequired[str]
    low_confidence: NotRequired[list[str]]
    durable: NotRequired[bool]


class TranscriptionCompleted(ServerEvent):
    item_id: str
    content_index: int
    transcript: str
    usage: Usage
    linguafusion: ItemExtension


class TranscriptionFailed(ServerEvent):
    item_id: str
    content_index: int
    error: OpenAIError


class TranslationDelta(ServerEvent):
    item_id: str
    content_index: int
    language: str
    delta: str


class TranslationCompleted(ServerEvent):
    item_id: str
    content_index: int
    language: str
    translation: str


def session_event(config: SessionConfig, dialect: Dialect, created: bool) -> SessionEvent:
    prefix = "transcription_session" if dialect == BETA else "session"
    return {"type": f"{prefix}.{'created' if created else 'updated'}", "event_id": new_id("event"),
            "session": config.to_wire(dialect)}


def openai_error_event(error: OpenAIError) -> ErrorEvent:
    """An ``error`` event with OpenAI's error object as is (openai_compat.py ``openai_error``)."""
    return {"type": "error", "event_id": new_id("event"), "error": error}


def error_event(message: str, *, code: str, kind: str = "invalid_request_error", param: str | None = None,
                client_event_id: str | None = None, details: JSONObject | None = None) -> ErrorEvent:
    error: RealtimeError = {"type": kind, "code": code, "message": message, "param": param,
                            "event_id": client_event_id}
    if details:
        error["details"] = details
    return openai_error_event(error)


def speech_started(item_id: str, ms: float) -> SpeechStarted:
    return {"type": "input_audio_buffer.speech_started", "event_id": new_id("event"), "item_id": item_id,
            "audio_start_ms": int(ms)}


def speech_stopped(item_id: str, ms: float) -> SpeechStopped:
    return {"type": "input_audio_buffer.speech_stopped", "event_id": new_id("event"), "item_id": item_id,
            "audio_end_ms": int(ms)}


def committed(item_id: str, previous: str | None) -> Committed:
    return {"type": "input_audio_buffer.committed", "event_id": new_id("event"), "item_id": item_id,
            "previous_item_id": previous}


def cleared() -> ServerEvent:
    return {"type": "input_audio_buffer.cleared", "event_id": new_id("event")}


def transcription_delta(item_id: str, delta: str) -> TranscriptionDelta:
    return {"type": "conversation.item.input_audio_transcription.delta", "event_id": new_id("event"),
            "item_id": item_id, "content_index": 0, "delta": delta}


def transcription_completed(item_id: str, transcript: str, seconds: float, extension: ItemExtension
                            ) -> TranscriptionCompleted:
    return {"type": "conversation.item.input_audio_transcription.completed", "event_id": new_id("event"),
            "item_id": item_id, "content_index": 0, "transcript": transcript,
            "usage": {"type": "duration", "seconds": round(max(0.0, seconds), 3)}, "linguafusion": extension}


def transcription_failed(item_id: str, message: str, code: str) -> TranscriptionFailed:
    return {"type": "conversation.item.input_audio_transcription.failed", "event_id": new_id("event"),
            "item_id": item_id, "content_index": 0,
            "error": {"type": "server_error", "code": code, "message": message, "param": None}}


def translation_delta(item_id: str, language: str, delta: str) -> TranslationDelta:
    return {"type": TRANSLATION_DELTA, "event_id": new_id("event"), "item_id": item_id, "content_index": 0,
            "language": language, "delta": delta}


def translation_completed(item_id: str, language: str, translation: str) -> TranslationCompleted:
    return {"type": TRANSLATION_COMPLETED, "event_id": new_id("event"), "item_id": item_id, "content_index": 0,
            "language": language, "translation": translation}
