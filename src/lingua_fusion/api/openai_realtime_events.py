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
from typing import Any

from ..errors import InvalidParameter
from ..serving.ports import SLO_CLASSES
from ..stream.protocol import MAX_TARGETS, POLICIES
from .openai_compat import SpeechModel, language_code, live_model
from .openai_realtime_audio import BETA_FORMATS, FORMATS

GA, BETA = "ga", "beta"
TRANSLATION_DELTA = "conversation.item.input_audio_translation.delta"
TRANSLATION_COMPLETED = "conversation.item.input_audio_translation.completed"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


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

    def start_message(self) -> dict[str, Any]:
        """The stream start message (stream/protocol.py) that serves this session."""
        msg: dict[str, Any] = {"type": "start", "source_lang": self.source,
                               "target_langs": list(self.targets) or [self.source], "slo": self.slo,
                               "partials": True, "inputs": ["audio"]}
        if self.glossary_id:
            msg["glossary_id"] = self.glossary_id
        return msg

    def stream_shape(self) -> tuple[Any, ...]:
        """What an open stream was built from: a change takes effect with the next stream (after a commit)."""
        return self.source, self.targets, self.glossary_id, self.slo, self.turn_detection

    # ---- reading an update -------------------------------------------------------------------------------------
    def updated(self, session: Any) -> SessionConfig:
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

    def _format(self, value: Any) -> SessionConfig:
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

    def _transcription(self, value: Any, where: str) -> SessionConfig:
        if value is None:
            return replace(self, model=SpeechModel("whisper-1"), language=None, prompt="")
        t = _dict(value, where)
        if "model" in t and t["model"] is not None and not isinstance(t["model"], str):
            raise InvalidParameter("transcription.model must be a string", details={"field": "model"})
        model = live_model(t["model"], field="model") if t.get("model") else self.model
        language = language_code(t["language"], field="language") if "language" in t else self.language
        return replace(self, model=model, language=model.language(language),
                       prompt=str(t.get("prompt") or "") if "prompt" in t else self.prompt)

    def _extension(self, ext: dict[str, Any]) -> SessionConfig:
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
            if not isinstance(ext["slo"], str) or ext["slo"] not in SLO_CLASSES:
                raise InvalidParameter(f"linguafusion.slo must be one of {sorted(SLO_CLASSES)}",
                                       details={"field": "slo"})
            new = replace(new, slo=str(ext["slo"]))
        return new

    # ---- writing it back ---------------------------------------------------------------------------------------
    def turn_detection_wire(self) -> dict[str, Any] | None:
        """The effective VAD settings (the SLO class's commit policy; a client's own values are not used)."""
        if not self.turn_detection:
            return None
        policy = POLICIES[self.slo]
        return {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                "silence_duration_ms": int(policy.eou_silence_s * 1000)}

    def extension_wire(self) -> dict[str, Any]:
        return {"target_languages": list(self.targets), "glossary_id": self.glossary_id, "slo": self.slo,
                "language_used": self.source}

    def to_wire(self, dialect: str) -> dict[str, Any]:
        transcription = {"model": self.model.name, "language": self.language, "prompt": self.prompt}
        if dialect == BETA:
            beta_format = next(k for k, v in BETA_FORMATS.items() if v == self.format)
            return {"id": self.id, "object": "realtime.transcription_session", "input_audio_format": beta_format,
                    "input_audio_transcription": transcription, "turn_detection": self.turn_detection_wire(),
                    "input_audio_noise_reduction": None, "include": [], "linguafusion": self.extension_wire()}
        fmt: dict[str, Any] = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = self.rate
        return {"type": "transcription", "id": self.id, "object": "realtime.transcription_session",
                "audio": {"input": {"format": fmt, "transcription": transcription, "noise_reduction": None,
                                    "turn_detection": self.turn_detection_wire()}},
                "include": [], "linguafusion": self.extension_wire()}


def _dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParameter(f"{where} must be an object", details={"field": where})
    return value


def _turn_detection(value: Any) -> bool:
    if value is None:
        return False
    kind = _dict(value, "turn_detection").get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise InvalidParameter("turn_detection.type must be server_vad or semantic_vad (or null)",
                               details={"field": "turn_detection"})
    return True


# ---- server events ---------------------------------------------------------------------------------------------
def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event"), **fields}


def session_event(config: SessionConfig, dialect: str, created: bool) -> dict[str, Any]:
    prefix = "transcription_session" if dialect == BETA else "session"
    return event(f"{prefix}.{'created' if created else 'updated'}", session=config.to_wire(dialect))


def error_event(message: str, *, code: str, kind: str = "invalid_request_error", param: str | None = None,
                client_event_id: str | None = None, details: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "code": code, "message": message, "param": param,
                             "event_id": client_event_id}
    if details:
        error["details"] = details
    return event("error", error=error)


def speech_started(item_id: str, ms: float) -> dict[str, Any]:
    return event("input_audio_buffer.speech_started", item_id=item_id, audio_start_ms=int(ms))


def speech_stopped(item_id: str, ms: float) -> dict[str, Any]:
    return event("input_audio_buffer.speech_stopped", item_id=item_id, audio_end_ms=int(ms))


def committed(item_id: str, previous: str | None) -> dict[str, Any]:
    return event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)


def cleared() -> dict[str, Any]:
    return event("input_audio_buffer.cleared")


def transcription_delta(item_id: str, delta: str) -> dict[str, Any]:
    return event("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0,
                 delta=delta)


def transcription_completed(item_id: str, transcript: str, seconds: float, extension: dict[str, Any]
                            ) -> dict[str, Any]:
    return event("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
                 transcript=transcript, usage={"type": "duration", "seconds": round(max(0.0, seconds), 3)},
                 linguafusion=extension)


def transcription_failed(item_id: str, message: str, code: str) -> dict[str, Any]:
    return event("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                 error={"type": "server_error", "code": code, "message": message, "param": None})


def translation_delta(item_id: str, language: str, delta: str) -> dict[str, Any]:
    return event(TRANSLATION_DELTA, item_id=item_id, content_index=0, language=language, delta=delta)


def translation_completed(item_id: str, language: str, translation: str) -> dict[str, Any]:
    return event(TRANSLATION_COMPLETED, item_id=item_id, content_index=0, language=language,
                 translation=translation)
