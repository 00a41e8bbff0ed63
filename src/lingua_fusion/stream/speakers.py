"""A live stream's speakers (start message ``diarize: true``): each committed utterance's voice embedded on the
engine, labelled in order by an online clusterer, and the display names its publisher gave.

- The start message: ``diarize`` (true / false, nothing else) and ``max_speakers`` (1 .. ``diarize.max_speakers``,
  only with ``diarize``); anything else is ``invalid_parameter`` naming the field (``parse_diarize``).
- ``embed``: the utterance's voice (its quiet frames left out, speakers/voiced.py) as one ``SpeakerInput`` work
  item on ``ModelKey.spk``: committed work, off the event loop, batched with other streams' and files' utterances
  by the executor (one forward of the voice encoder a batch), at most ``diarize.stream_max_windows`` 1.6 s windows
  an utterance. It runs beside the utterance's ASR (stream/jobs.py), so it adds no step to a caption's latency
  unless it is the slower of the two. A failure (after the executor's retries) leaves the final without a speaker,
  with a note.
- ``label``: called by the emitter (stream/finals.py) as it takes each final in input order, so "S1", "S2", ... are
  named as speakers appear whatever order the jobs finish in. One online pass (speakers/cluster.py
  ``SpeakerClusterer`` at ``diarize.stream_threshold``, a lower bar for a short utterance): a live caption cannot
  wait for a second pass, so an early utterance is never relabelled; past ``max_speakers`` a new voice joins the
  closest speaker with a low ``speaker_confidence``. ``latency_ms.speaker``: what the embedding took.
- ``rename``: ``{"type": "rename_speaker", "speaker": "S1", "name": "Dr. Chen"}`` (``name`` null or "" takes
  the name away): a ``speaker_renamed`` event, and later finals carry ``speaker_name``.
- ``state`` / ``restore``: the centroids (float16, ~0.7 KB a speaker) and the names ride in the stream's snapshot
  with each logged final (state/streams.py), so a resumed stream keeps its labels and names. A rename made after
  the last logged final is in the snapshot only with the next final.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from ..config import DiarizeSettings
from ..errors import InvalidParameter, LinguaFusionError
from ..serving.keys import ModelKey
from ..serving.ports import CallContext, ModelPort, SpeakerInput
from ..speakers.cluster import SHORT_SLACK, ClustererState, SpeakerClusterer
from ..speakers.voiced import voiced
from .events import Final, SpeakerRenamed

RATE = 16000
LABEL = re.compile(r"^S([1-9][0-9]?)$")
MAX_NAME = 64  # characters of a display name
MIN_VOICE_S = 0.1  # an utterance with less voice than this (a click, a cough) gets no speaker


def parse_diarize(msg: Mapping[str, object], most: int) -> tuple[bool, int]:
    """A start message's ``diarize`` and ``max_speakers`` -> (diarize, the stream's speaker cap; 0 without)."""
    on = msg.get("diarize", False)
    if type(on) is not bool:  # "yes", 1 and null are not switches a client meant
        raise InvalidParameter("diarize must be true or false", details={"field": "diarize"})
    cap = msg.get("max_speakers")
    if cap is None:
        return on, most if on else 0
    if not on:
        raise InvalidParameter("max_speakers bounds diarize: it goes with diarize: true",
                               details={"field": "max_speakers"})
    if type(cap) is not int or not 1 <= cap <= most:
        raise InvalidParameter(f"max_speakers must be an integer from 1 to {most} (diarize.max_speakers)",
                               details={"field": "max_speakers", "max": most})
    return True, cap


class SpeakersJSON(TypedDict):
    """A diarize stream's speakers as its snapshot keeps them (``StreamSpeakers.state``, read by ``restore``)."""

    clusterer: ClustererState
    names: dict[str, str]


@dataclass(frozen=True)
class Voice:
    """An utterance's voice: its embedding (None: too little voice, or the embedding failed) and seconds of voice."""

    embedding: np.ndarray | None
    seconds: float
    failure: str | None = None
    ms: float = 0.0  # how long the embedding took (queue and forward), beside the utterance's ASR


class StreamSpeakers:
    def __init__(self, port: ModelPort, max_speakers: int, settings: DiarizeSettings,
                 context: Callable[[float], CallContext]) -> None:
        self.port = port
        self.max_windows = settings.stream_max_windows
        self.hop = max(1, int(settings.window_hop_s * RATE))
        self.clusterer = SpeakerClusterer(threshold=settings.stream_threshold, max_speakers=max_speakers,
                                          slack=SHORT_SLACK)
        self.names: dict[str, str] = {}
        self._context = context  # a committed call's context, its clock started at the words' arrival

    async def embed(self, audio: np.ndarray, wall_ref: float) -> Voice:
        """The utterance's voice embedding (the mean of its windows' unit embeddings), on the engine."""
        voice = voiced(np.asarray(audio, np.float32))
        seconds, t0 = len(voice) / RATE, time.monotonic()
        if seconds < MIN_VOICE_S:
            return Voice(None, seconds)
        try:
            windows = await self.port.run(ModelKey.spk(), SpeakerInput(voice, self.hop, self.max_windows),
                                          self._context(wall_ref))
        except LinguaFusionError as exc:  # failed after its retries, or the queue is full: no speaker, a note
            return Voice(None, seconds, f"speaker embedding failed: {exc.public_message}")
        ms = round((time.monotonic() - t0) * 1000, 1)
        if windows is None or not len(windows):
            return Voice(None, seconds, ms=ms)
        return Voice(np.asarray(windows, np.float32).mean(axis=0), seconds, ms=ms)

    def label(self, final: Final) -> None:
        """``final``'s speaker from its voice (in input order: the emitter calls this as it takes each final)."""
        voice, final.voice = final.voice, None
        if not isinstance(voice, Voice):
            return
        if voice.ms:
            final.latency_ms["speaker"] = voice.ms
        if voice.failure:
            final.note = f"{final.note}; {voice.failure}" if final.note else voice.failure
        if voice.embedding is None or not final.source_text.strip():
            return
        got = self.clusterer.assign(voice.embedding, voice.seconds)
        if got is not None:
            final.speaker, final.speaker_confidence = got.label, got.confidence

    def name(self, final: Final) -> None:
        """``final``'s display name, as its speaker is named now (just before it is logged and sent)."""
        final.speaker_name = self.names.get(final.speaker) if final.speaker else None

    def rename(self, speaker: object, name: object) -> SpeakerRenamed:
        """Name ``speaker`` ("S1" .. up to the stream's cap; one not heard yet may be named ahead)."""
        m = LABEL.match(speaker) if isinstance(speaker, str) else None
        if not isinstance(speaker, str) or m is None or int(m.group(1)) > self.clusterer.max_speakers:
            raise InvalidParameter(f"speaker must be a label of this stream, S1 to S{self.clusterer.max_speakers}",
                                   details={"field": "speaker"})
        if name is not None and not isinstance(name, str):
            raise InvalidParameter("name must be a string (null or \"\" takes the name away)",
                                   details={"field": "name"})
        name = " ".join((name or "").split())  # one line, no control characters' layout tricks
        if len(name) > MAX_NAME or any(not ch.isprintable() for ch in name):
            raise InvalidParameter(f"name must be printable, at most {MAX_NAME} characters",
                                   details={"field": "name", "max": MAX_NAME})
        if name:
            self.names[speaker] = name
        else:
            self.names.pop(speaker, None)
        return SpeakerRenamed(speaker=speaker, name=name or None, names=dict(self.names))

    def state(self) -> SpeakersJSON:
        """What the stream's snapshot keeps (``restore`` reads it)."""
        return {"clusterer": self.clusterer.state(), "names": dict(self.names)}

    def restore(self, state: object) -> None:
        if not isinstance(state, dict):
            return  # a snapshot from before diarization, or none: labels start again
        if isinstance(state.get("clusterer"), dict):
            self.clusterer.restore(state["clusterer"])
        names = state.get("names")
        if isinstance(names, dict):
            self.names = {str(k): str(v) for k, v in names.items() if LABEL.match(str(k))}
