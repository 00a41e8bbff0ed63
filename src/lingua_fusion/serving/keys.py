"""ModelKey: which model a piece of work runs on. Built and parsed here only.

The string form (``asr:tiny.en``, ``asr:base:de``, ``asr:base:auto``: spoken language identification, ``mt:en-es``,
``ocr``, ``tts:es``, ``vad``, ``spk``: speaker embeddings) is what the scheduler
queues by, what metrics label, and what a chaos fault's ``model`` prefix matches.
"""

from __future__ import annotations

from dataclasses import dataclass

TASKS = ("asr", "mt", "ocr", "tts", "vad", "spk")
DETECT = "auto"  # the ASR "language" of spoken language identification (ModelKey.detect)


@dataclass(frozen=True)
class ModelKey:
    task: str  # one of TASKS
    source: str = ""  # ASR: the spoken language; MT: the source language; TTS: the voice's language
    target: str = ""  # MT only

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown model task {self.task!r}")

    @classmethod
    def asr(cls, lang: str) -> ModelKey:
        return cls("asr", lang)

    @classmethod
    def detect(cls) -> ModelKey:
        """Which of a stream's candidate languages an utterance is in (``DetectInput``): the multilingual Whisper's
        language identification. An ASR key of its own, not a task: it is a caption's first ASR step (the stage's
        budget, the breaker's window), and a queue of its own keeps its cheap encoder-only items out of the
        transcription batches, whose cost model would otherwise learn from both."""
        return cls("asr", DETECT)

    @classmethod
    def mt(cls, source: str, target: str) -> ModelKey:
        return cls("mt", source, target)

    @classmethod
    def tts(cls, lang: str) -> ModelKey:
        return cls("tts", lang)

    @classmethod
    def ocr(cls) -> ModelKey:
        return cls("ocr")

    @classmethod
    def vad(cls) -> ModelKey:
        return cls("vad")

    @classmethod
    def spk(cls) -> ModelKey:
        """Speaker embeddings of a file's or a stream's speech (models/speaker.py), for diarization."""
        return cls("spk")

    @property
    def stage(self) -> str:
        """The stage of a caption this work belongs to (the scheduler's budget share, the breaker's window)."""
        return self.task

    def __str__(self) -> str:
        if self.task == "asr":
            return "asr:tiny.en" if self.source == "en" else f"asr:base:{self.source}"
        if self.task == "mt":
            return f"mt:{self.source}-{self.target}"
        if self.task == "tts":
            return f"tts:{self.source}"
        return self.task

    @classmethod
    def parse(cls, text: str) -> ModelKey:
        task, _, rest = text.partition(":")
        if task == "asr":
            return cls.asr("en" if rest == "tiny.en" else rest.partition(":")[2])
        if task == "mt":
            src, _, tgt = rest.partition("-")
            return cls.mt(src, tgt)
        if task == "tts":
            return cls.tts(rest)
        return cls(task)
