"""What a file request is: ``FileRequest`` as sent, ``ValidRequest`` once ``files/validate.py`` has checked it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..glossary import Term
from ..models.routes import MTRoute
from ..types import Modality

if TYPE_CHECKING:
    from ..vision.file_signs import SignReader


@dataclass
class FileRequest:
    source_modality: str | None  # None or "": told by the bytes (text when ``text`` is given)
    target_lang: str
    target_modality: str = "text"
    source_lang: str | None = None
    data: bytes | None = None
    text: str | None = None
    glossary: list[Term] = field(default_factory=list)
    filename: str = ""
    prompt: str | None = None  # ASR context (Whisper's initial prompt): names, spellings, the style wanted
    transcribe_only: bool = False  # speech -> text in the spoken language: no MT; target_lang is not used
    signs: SignReader | None = None  # a video's signs read with the key's vocabulary_id
    scope: str = ""  # the requesting API key's id: whose translation memory the request may use (tm/key.py)
    diarize: bool = False  # speech only: each segment's speaker (files/diarize.py)
    max_speakers: int | None = None  # with diarize: at most this many (None: diarize.max_speakers)
    word_timestamps: bool = False  # speech: each segment's words with their times (segments[i].words)


@dataclass(frozen=True)
class ValidRequest:
    """A FileRequest that passed ``FileTranslator.validate``: parsed modalities, normalised languages, the MT
    route (None while the source language is unknown or equals the target), a text request's decoded text."""

    request: FileRequest
    source_modality: Modality
    target_modality: Modality
    target_lang: str
    source_lang: str | None
    route: MTRoute | None
    text: str | None = None  # text requests only
    container: str | None = None  # media requests only: what the bytes are (wav, mp4, png, ...)
    speech_translation: bool = False  # no MT pair: Whisper translates the speech into English (then MT from en)
    source_confidence: float | None = None  # set when the text's language was identified here
