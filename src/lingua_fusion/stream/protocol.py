"""The live-stream protocol in code: the start and resume messages, a stream's spec, SLO policies, close codes.

It matches docs/streaming.md and docs/asyncapi.yaml. Close codes: 4000 + the HTTP status of the error (4400 bad
start message, 4401 unauthenticated, 4403 forbidden, 4408 idle, 4413 message too large, 4429 overloaded: admission
refused, or a client that stopped reading), 4409 taken over (the stream was resumed by another connection),
1009 a message over the frame limit (``server.max_ws_message_bytes``), 1012 the server is draining (reconnect and
resume), 1011 server error.
"""

from __future__ import annotations

import math
import numbers
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from .. import langs
from ..errors import InvalidParameter, LinguaFusionError, UnsupportedPair
from ..glossary import Term
from ..models.routes import MTRoute
from ..models.transcript_guard import SCRIPT_NAMES, script_for
from ..serving.ports import SLO_CLASSES
from ..speakers.cluster import MAX_SPEAKERS
from .languages import DETECTABLE, MAX_SOURCE_LANGS
from .policy import PolicyConfig
from .speakers import parse_diarize
from .stored import items, number, number_map, text, text_map, text_or_none, texts, texts_map

POLICIES = {
    "interactive": PolicyConfig(step_s=0.5, eou_silence_s=0.3, max_utterance_s=6.0, sentence_hold_s=4.0),
    "standard": PolicyConfig(step_s=1.0, eou_silence_s=0.4, max_utterance_s=10.0, sentence_hold_s=8.0),
    "batch": PolicyConfig(step_s=3.0, eou_silence_s=0.6, max_utterance_s=15.0, sentence_hold_s=15.0),
}
INPUTS = ("audio", "image", "text", "video")  # what a stream may send (video: frame messages); a stream declares
# a subset in its start message
AUDIO_FORMATS = ("pcm16", "webm", "ogg")  # webm / ogg: Opus, as a browser's MediaRecorder sends it
MAX_START_BYTES = 64 * 1024
MAX_TARGETS = 8
AUTO = "auto"  # source_lang: each utterance's language is detected (stream/languages.py)
MAX_TS = 1e10  # seconds: a media timestamp beyond (about year 2286 as a Unix time) is refused, not overflowed


class SpecJSON(TypedDict):
    """A stream's spec as the stream log keeps it (``StreamSpec.to_dict``)."""

    source_lang: str
    targets: list[str]
    slo: str
    importance: float
    partials: bool
    glossary: list[list[str]]  # [source, target] per term
    min_confidence: float
    speech: bool
    audio_format: str
    clock_offsets: dict[str, float]
    inputs: list[str]
    low_confidence: list[str]
    key_id: str
    vocabulary_id: str
    source_script: str | None
    target_scripts: dict[str, str]
    source_langs: list[str]
    low_confidence_from: dict[str, list[str]]
    diarize: bool
    max_speakers: int
    word_timestamps: bool


@dataclass
class StreamSpec:
    source_lang: str
    targets: list[str]
    slo: str = "standard"
    importance: float = 0.5
    partials: bool = True
    glossary: list[Term] = field(default_factory=list)
    min_confidence: float = 0.4
    speech: bool = False
    audio_format: str = "pcm16"
    # seconds added to a modality's media timestamps to bring it onto the audio clock (camera / slide skew)
    clock_offsets: dict[str, float] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=lambda: list(INPUTS))  # no audio: no speech capacity reserved
    low_confidence: list[str] = field(default_factory=list)  # targets whose route goes through the tiny LLM
    stream_id: str = field(default_factory=lambda: "st_" + secrets.token_hex(8))
    resume_token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    key_id: str = ""  # the API key that opened the stream: only it (or an admin key) may resume it
    vocabulary_id: str = ""  # the key's sign vocabulary: video frames are also read for signs (vision/)
    # Chinese in the script its tag asked for (models/transcript_guard.py): the transcript's ("Hans" / "Hant", None
    # for other languages) and each Chinese target's; zh is Simplified, zh-TW / zh-Hant / zh-HK Traditional
    source_script: str | None = None
    target_scripts: dict[str, str] = field(default_factory=dict)
    # ``source_lang: "auto"``: the languages each utterance may be detected in (stream/languages.py), the first is
    # ``source_lang`` (what text, slides and partials before the first detection are read in); empty: the language
    # was given. And per candidate, the targets whose route from it goes through the tiny LLM
    source_langs: list[str] = field(default_factory=list)
    low_confidence_from: dict[str, list[str]] = field(default_factory=dict)
    # ``diarize: true``: each final's speaker (stream/speakers.py), at most ``max_speakers`` of them (0: not asked)
    diarize: bool = False
    max_speakers: int = 0
    # ``word_timestamps: true``: each final's spoken words with their times in stream seconds (stream/jobs.py)
    word_timestamps: bool = False

    @property
    def policy(self) -> PolicyConfig:
        return POLICIES[self.slo]

    @property
    def detects(self) -> bool:
        """Is each utterance's language detected (``source_lang: "auto"``)?"""
        return bool(self.source_langs)

    def low_targets(self, source: str) -> list[str]:
        """The targets whose route from ``source`` goes through the tiny LLM."""
        return self.low_confidence_from.get(source, []) if self.detects else self.low_confidence

    def scripts(self) -> dict[str, str] | None:
        """What the ready event and each final say of the scripts: ``source`` (the transcript) and each Chinese
        target, as files' ``models.asr_script`` does ("zh-Hant (Traditional)"); None when no Chinese is in it."""
        named = {**({"source": self.source_script} if self.source_script else {}), **self.target_scripts}
        return {k: SCRIPT_NAMES[v] for k, v in named.items()} or None

    def to_dict(self) -> SpecJSON:
        """What the stream log keeps, so a resume after a restart rebuilds the same stream."""
        return {"source_lang": self.source_lang, "targets": self.targets, "slo": self.slo,
                "importance": self.importance, "partials": self.partials,
                "glossary": [[t.source, t.target] for t in self.glossary], "min_confidence": self.min_confidence,
                "speech": self.speech, "audio_format": self.audio_format, "clock_offsets": self.clock_offsets,
                "inputs": self.inputs, "low_confidence": self.low_confidence, "key_id": self.key_id,
                "vocabulary_id": self.vocabulary_id, "source_script": self.source_script,
                "target_scripts": self.target_scripts, "source_langs": self.source_langs,
                "low_confidence_from": self.low_confidence_from, "diarize": self.diarize,
                "max_speakers": self.max_speakers, "word_timestamps": self.word_timestamps}

    @classmethod
    def from_dict(cls, d: Mapping[str, object], stream_id: str, resume_token: str) -> StreamSpec:
        """The spec ``to_dict`` kept (the stream log's: read back as written, with what older snapshots lack)."""
        source, targets = text(d["source_lang"]), texts(d["targets"])
        glossary = [texts(pair) for pair in items(d.get("glossary", []))]
        return cls(source_lang=source, targets=targets, slo=text(d["slo"]),
                   importance=float(number(d["importance"])), partials=bool(d["partials"]),
                   glossary=[Term(s, t) for s, t in glossary],
                   min_confidence=float(number(d["min_confidence"])), speech=bool(d["speech"]),
                   audio_format=text(d.get("audio_format", "pcm16")),
                   clock_offsets=number_map(d.get("clock_offsets", {})),
                   inputs=texts(d.get("inputs", INPUTS)), low_confidence=texts(d.get("low_confidence", [])),
                   stream_id=stream_id, resume_token=resume_token,
                   key_id=str(d.get("key_id", "")),  # a snapshot from before keys were stored: admin only
                   vocabulary_id=str(d.get("vocabulary_id", "")),
                   # a snapshot from before scripts were stored: zh was Simplified
                   source_script=text_or_none(d.get("source_script", "Hans" if source == "zh" else None)),
                   target_scripts=text_map(d.get("target_scripts", {t: "Hans" for t in targets if t == "zh"})),
                   source_langs=texts(d.get("source_langs", [])),
                   low_confidence_from=texts_map(d.get("low_confidence_from", {})),
                   diarize=bool(d.get("diarize", False)), max_speakers=int(number(d.get("max_speakers", 0))),
                   word_timestamps=bool(d.get("word_timestamps", False)))


@dataclass(frozen=True)
class ResumeRequest:
    """A reconnecting client: the stream it had, its token, and the last final it received."""

    stream_id: str
    resume_token: str
    last_seq: int


def _lang(raw: object, field: str) -> str:
    """A client's language tag, normalised (``langs.normalize`` reads anything but None as its ``str``)."""
    return langs.normalize(raw if raw is None or isinstance(raw, str) else str(raw), field=field)


def _number(raw: object) -> float:
    """A client's number, as ``float()`` reads it (a string of one too); anything else is a ``TypeError``."""
    if not isinstance(raw, numbers.Real | str):  # numpy's and the SDK caller's numbers too
        raise TypeError(f"{type(raw).__name__} is not a number")
    return float(raw)


def parse_start(msg: Mapping[str, object], check_pair: Callable[[str, str], MTRoute | None], glossary: list[Term],
                most_speakers: int = MAX_SPEAKERS) -> StreamSpec:
    """A new stream's start message -> its spec. ``check_pair(source, target)`` raises ``unsupported_pair``; the
    route it returns tells whether that target's finals come from the low-confidence LLM. ``most_speakers``: the
    server's ``diarize.max_speakers`` (a start message's ``max_speakers`` may only lower it)."""
    if msg.get("type") != "start":
        raise InvalidParameter("the first message must be {\"type\": \"start\", ...}")
    raw_source = msg.get("source_lang") or ("auto" if msg.get("source_langs") is not None else "en")
    auto = isinstance(raw_source, str) and raw_source.strip().lower() == AUTO
    source = "" if auto else _lang(raw_source, "source_lang")
    raw_targets = msg.get("target_langs") or ([msg["target_lang"]] if msg.get("target_lang") else [])
    if not raw_targets or not isinstance(raw_targets, list) or len(raw_targets) > MAX_TARGETS:
        raise InvalidParameter(f"target_langs must list 1 to {MAX_TARGETS} languages")
    targets = [_lang(t, "target_langs") for t in raw_targets]
    target_scripts: dict[str, str] = {}
    for raw, t in zip(raw_targets, targets, strict=True):
        script = _script(raw, t)
        if script is not None and target_scripts.setdefault(t, script) != script:
            raise InvalidParameter("a stream's Chinese captions have one script: ask for zh (Simplified) or zh-TW "
                                   "(Traditional), not both", details={"field": "target_langs"})
    if msg.get("source_langs") is not None and not auto:
        raise InvalidParameter('source_langs lists the languages to detect: it goes with source_lang "auto"',
                               details={"field": "source_langs"})
    source_langs, low_from = _candidates(msg, targets, check_pair) if auto else ([], {})
    source = source_langs[0] if auto else source
    low_confidence = low_from.get(source, []) if auto else _low_targets(source, targets, check_pair)
    slo = str(msg.get("slo", "standard"))
    if slo not in SLO_CLASSES:
        raise InvalidParameter(f"slo must be one of {sorted(SLO_CLASSES)}")
    try:
        importance = _number(msg.get("importance", msg.get("priority", 0.5)))
        min_conf = _number(msg.get("min_confidence", 0.4))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidParameter("importance and min_confidence must be numbers in [0, 1]") from exc
    if not (0.0 <= importance <= 1.0 and 0.0 <= min_conf <= 1.0):
        raise InvalidParameter("importance and min_confidence must be numbers in [0, 1]")
    offsets = msg.get("clock_offsets") or {}
    if not isinstance(offsets, dict) or any(k not in ("image", "text") or not isinstance(v, int | float)
                                            or abs(v) > 60 for k, v in offsets.items()):
        raise InvalidParameter("clock_offsets maps 'image' / 'text' to seconds (|offset| <= 60)")
    audio_format = str(msg.get("audio_format", "pcm16")).lower()
    if audio_format not in AUDIO_FORMATS:
        raise InvalidParameter("audio_format must be pcm16, webm or ogg (Opus)")
    inputs = msg.get("inputs", list(INPUTS))
    if not isinstance(inputs, list) or not inputs or any(i not in INPUTS for i in inputs):
        raise InvalidParameter("inputs lists what the stream will send: a non-empty subset of audio, image, text, "
                               "video")
    diarize, max_speakers = parse_diarize(msg, most_speakers)
    if diarize and "audio" not in inputs:
        raise InvalidParameter("diarize tells speakers apart by their voices: the stream's inputs need audio",
                               details={"field": "diarize"})
    words = msg.get("word_timestamps", False)
    if not isinstance(words, bool) or (words and "audio" not in inputs):
        raise InvalidParameter("word_timestamps is true or false, and times spoken words: the stream's inputs "
                               "need audio", details={"field": "word_timestamps"})
    return StreamSpec(source_lang=source, targets=targets, slo=slo, importance=importance,
                      partials=bool(msg.get("partials", True)), glossary=glossary, min_confidence=min_conf,
                      speech=bool(msg.get("speech", False)), audio_format=audio_format,
                      clock_offsets={k: float(v) for k, v in offsets.items()}, inputs=sorted(set(inputs)),
                      low_confidence=low_confidence, source_script=_script(raw_source, source),
                      target_scripts=target_scripts, source_langs=source_langs, low_confidence_from=low_from,
                      diarize=diarize, max_speakers=max_speakers, word_timestamps=words)


def _low_targets(source: str, targets: list[str], check_pair: Callable[[str, str], MTRoute | None]) -> list[str]:
    """The targets whose route from ``source`` goes through the tiny LLM; raises ``unsupported_pair`` for a target
    with no route from it."""
    low = []
    for t in targets:
        route = check_pair(source, t) if t != source else None
        if route is not None and route.low_confidence:
            low.append(t)
    return low


def _candidates(msg: Mapping[str, object], targets: list[str], check_pair: Callable[[str, str], MTRoute | None]
                ) -> tuple[list[str], dict[str, list[str]]]:
    """A ``source_lang: "auto"`` stream's candidate languages, and each one's tiny-LLM targets. Listed in the start
    message (``source_langs``, 1 to MAX_SOURCE_LANGS): each must have a route to every target (else
    ``unsupported_pair``); left out: those of ``DETECTABLE`` that have one. A room's stream gives its language: its
    listeners' languages are checked against it, and its partials are translated for them from it."""
    if msg.get("room"):
        raise InvalidParameter('a room\'s stream gives its source_lang: "auto" is for streams that are not rooms',
                               details={"field": "source_lang"})
    asked = msg.get("source_langs")
    if asked is not None and (not isinstance(asked, list) or not 1 <= len(asked) <= MAX_SOURCE_LANGS):
        raise InvalidParameter(f"source_langs must list 1 to {MAX_SOURCE_LANGS} languages",
                               details={"field": "source_langs"})
    pool = (list(dict.fromkeys(_lang(c, "source_langs") for c in asked)) if isinstance(asked, list) and asked
            else list(DETECTABLE))
    chosen: dict[str, list[str]] = {}
    for lang in pool:
        try:
            chosen[lang] = _low_targets(lang, targets, check_pair)
        except UnsupportedPair:
            if asked:  # the client named it: say which pair cannot be served
                raise
    if not chosen:
        raise UnsupportedPair(f"no language this server can detect ({', '.join(DETECTABLE)}) has a route to every "
                              f"target ({', '.join(targets)}): give source_lang, or fewer targets",
                              details={"field": "target_langs"})
    return list(chosen), chosen


def _script(raw: object, lang: str) -> str | None:
    """The script a (valid) language tag asks for: zh-TW / zh-Hant / zh-HK "Hant", any other Chinese "Hans",
    None for a language that is not Chinese."""
    if lang != "zh":
        return None
    return script_for(str(raw).strip().lower().replace("_", "-")) or "Hans"


def parse_resume(resume: object) -> ResumeRequest:
    if not isinstance(resume, dict) or not resume.get("stream_id") or not resume.get("resume_token"):
        raise InvalidParameter("resume needs stream_id, resume_token and last_seq")
    last_seq = resume.get("last_seq", 0)
    if type(last_seq) is not int:  # 1.5, "3" and true are not sequence numbers (int() took them)
        raise InvalidParameter("last_seq must be an integer")
    if not 0 <= last_seq < 2**53:
        raise InvalidParameter("last_seq must be an integer from 0 to 2**53")
    return ResumeRequest(str(resume["stream_id"]), str(resume["resume_token"]), last_seq)


def check_ts(ts: object) -> float | None:
    """A message's media timestamp: None, or a finite number of seconds from 0 to MAX_TS. A negative one is a
    client's clock bug (a media clock starts at 0, a Unix time is positive): refused, so the client hears of it."""
    if ts is None:
        return None
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts) or abs(ts) > MAX_TS:
        raise InvalidParameter(f"ts must be a finite number of seconds, at most {MAX_TS:g} in size")
    if ts < 0:
        raise InvalidParameter(f"ts must not be negative (got {ts:g}): it is a time in seconds on the client's "
                               "media clock, which starts at 0; the message was dropped",
                               details={"field": "ts", "ts": ts})
    return float(ts)


def close_code(err: LinguaFusionError) -> int:
    if err.code == "draining":
        return 1012  # service restart: reconnect
    return 4000 + err.status if 400 <= err.status < 500 else 1011
