"""Whisper ASR through faster-whisper (CTranslate2, int8 on CPU)."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError
from .base import ASRResult, ASRSegment, ASRWord, BackendInfo, among
from .transcript_guard import heard_nothing, mean_logprob

ZH_PROMPT = "以下是普通话的句子。"  # Simplified-Chinese prompt so Whisper writes Simplified characters
# The trimmed window's rule (window_samples). Measured by bench/whisper_trim.py (docs/benchmarks.md): with 6 s and no
# trailing silence, tiny.en looped on 7 of 36 sentences and invented sentences after 10 s talks (WER 18%); at least
# 8 s with 2 s of silence after the clip: 2 loops in 36 (the guard repairs them) and 0% on the talks.
MIN_WINDOW_S = 8
TRAILING_PAD_S = 2.0


_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+")


def window_samples(n: int, min_window_s: float | None = None, pad_s: float | None = None) -> int:
    """The trimmed window for a clip of ``n`` samples: at least ``min_window_s`` (MIN_WINDOW_S) and the clip plus
    ``pad_s`` (TRAILING_PAD_S) of silence, in whole 2 s steps, at most 30 s. Windows under ~5 s make Whisper loop
    ("The meeting starts at 10. The meeting starts at 10. ..."); bench/whisper_trim.py measures the choices."""
    floor = int((MIN_WINDOW_S if min_window_s is None else min_window_s) * 16000) // 32000 * 32000
    need = int(np.ceil((n + (TRAILING_PAD_S if pad_s is None else pad_s) * 16000) / 32000)) * 32000
    return min(30 * 16000, max(floor, need, 32000))


def _key(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def _drop_repeated_sentences(text: str) -> str:
    """ "Good morning. Good morning." -> "Good morning.": a sentence of 2+ words equal to the one before it (case and
    punctuation aside) is a decoder loop, typical of clips much shorter than their window (issue 12)."""
    out: list[str] = []
    last: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        keys = [k for k in (_key(w) for w in sentence.split()) if k]
        if len(keys) >= 2 and keys == last:
            continue
        out.append(sentence)
        last = keys
    return " ".join(out)


def caption_text(decoded: str) -> str:
    """Whisper's decoded tokens as a caption: a character cut off by the length budget (its UTF-8 bytes split over
    tokens, decoded as U+FFFD; a Mandarin clip's last character, say) is dropped rather than failing the whole
    utterance's output check (serving/threads.py), and a decoder loop is collapsed (``collapse_repeats``)."""
    return collapse_repeats(decoded.replace("\ufffd", "").strip())


def collapse_repeats(text: str, min_words: int = 3) -> str:
    """Drop a decoder loop: a sentence that repeats the one before, a run of >= min_words words that immediately
    repeats, or a tail that restarts the text."""
    words = _drop_repeated_sentences(text).split()
    keys = [_key(w) for w in words]
    i = 0
    while i < len(words):
        cut = False
        for n in range(min_words, (len(words) - i) // 2 + 1):
            if keys[i:i + n] == keys[i + n:i + 2 * n]:
                del words[i + n:i + 2 * n]
                del keys[i + n:i + 2 * n]
                cut = True
                break
        if not cut:
            i += 1
    for k in range(3, len(words)):
        tail = keys[k:]
        restarts = tail[:3] == keys[:3] if len(tail) >= 3 else (len(tail) >= 2 and tail == keys[:len(tail)])
        if restarts:  # the decoder started the clip over
            words = words[:k]
            break
    return " ".join(words)


MAX_TEXT_CONTEXT = 448  # Whisper's decoder positions


def decode_length(budget: int, forwarded: int) -> int:
    """CTranslate2's ``max_length`` for ``budget`` new tokens after a prompt of which ``forwarded`` tokens are fed
    at once. It decodes ``min(max_length // 2, max_length - forwarded)`` steps and refuses ``max_length ==
    forwarded`` ("The maximum decoding length must be > 0": a 1 s clip whose prompt, a video stream's slide words,
    was 22 tokens); a prompt at least as long as the budget gets the budget after it."""
    return budget if budget > forwarded else min(MAX_TEXT_CONTEXT, forwarded + budget)


class WhisperASR:
    def __init__(self, model_dir: Path, info: BackendInfo, *, compute_type: str = "int8", threads: int = 2,
                 beam_size: int = 1, workers: int = 1) -> None:
        """``workers``: decodes that run at once (from as many threads); CTranslate2 keeps that many workers
        (inter_threads) over one copy of the weights, and ``threads`` is split between them (at least 1 each)."""
        from faster_whisper import WhisperModel

        self.workers = max(1, workers)
        self.threads_per_worker = max(1, threads // self.workers)
        try:
            self._model = WhisperModel(str(model_dir), device="cpu", compute_type=compute_type,
                                       cpu_threads=self.threads_per_worker, num_workers=self.workers)
        except Exception as exc:  # CTranslate2 raises RuntimeError on missing/corrupt files
            raise BackendError(f"cannot load Whisper model from {model_dir}: {exc}") from exc
        self.info = info
        self._beam = beam_size
        # at most ``workers`` decodes at once: a further caller waits here, not inside CTranslate2's queue
        self._lock = threading.BoundedSemaphore(self.workers)
        self.multilingual = self._model.model.is_multilingual

    def transcribe_batch(self, audios: list[np.ndarray], *, language: str | None,
                         prompts: list[str | None] | None = None, max_new_tokens: int = 160) -> list[tuple[str, float]]:
        """Decode several short clips (one per stream) in one CTranslate2 call. Returns (text, confidence) each.

        Unlike ``transcribe`` (faster-whisper pads every clip to Whisper's 30 s window), the encoder here runs on the
        batch's longest clip only, rounded up to 1 s: a 3 s partial costs a tenth of a 30 s window.
        """
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer

        if not audios:
            return []
        lang = "en" if not self.multilingual else (language or "en")
        longest = max(len(a) for a in audios)
        feats = self._trimmed(audios, window_samples(longest))
        tok = Tokenizer(self._model.hf_tokenizer, self.multilingual, task="transcribe", language=lang)
        prevs = []
        for i in range(len(audios)):
            text = (prompts[i] if prompts else None) or (ZH_PROMPT if lang == "zh" else None)
            prevs.append(tok.encode(" " + text.strip())[-100:] if text else [])
        # CTranslate2 needs <|startoftranscript|> at the same position in every row: left-pad shorter prompts
        width = max(len(p) for p in prevs)
        space = tok.encode(" ")[:1]
        prompt_ids = [self._model.get_prompt(tok, space * (width - len(p)) + p, without_timestamps=True)
                      for p in prevs]
        with self._lock:
            # bound the output by the audio length (~5 tokens per second of speech) and forbid loops: on clips
            # shorter than their window, Whisper without timestamps otherwise repeats itself
            budget = decode_length(min(max_new_tokens, int(8 * longest / 16000) + 16), len(prompt_ids[0]) - 1)
            res = self._model.model.generate(ctranslate2.StorageView.from_array(feats), prompt_ids, beam_size=1,
                                             max_length=budget, return_scores=True, no_repeat_ngram_size=4,
                                             return_no_speech_prob=True, suppress_blank=True)
        out = []
        for r in res:
            ids = [t for t in r.sequences_ids[0] if t < tok.eot]
            length = max(1, len(r.sequences_ids[0]))
            avg_logprob = r.scores[0] / length if r.scores else -5.0
            conf = float(np.exp(min(0.0, avg_logprob))) * (1.0 - float(r.no_speech_prob))
            silent = heard_nothing(float(r.no_speech_prob), mean_logprob(r.scores[0], length) if r.scores else -5.0)
            text = "" if silent else caption_text(tok.decode(ids))  # Whisper's own no-speech rule
            out.append((text, round(min(1.0, max(0.0, conf)), 4)))
        return out

    def _trimmed(self, audios: list[np.ndarray], n: int) -> np.ndarray:
        """The log-mels of ``audios`` in one zero-padded window of ``n`` samples each (a longer clip: its end)."""
        padded = np.zeros((len(audios), n), dtype=np.float32)
        for i, a in enumerate(audios):
            padded[i, : min(n, len(a))] = a[-n:] if len(a) > n else a
        return np.stack([self._model.feature_extractor(x)[:, : n // 160] for x in padded])

    def detect_batch(self, audios: list[np.ndarray], candidates: Sequence[str], *,
                     window_s: float | None = None) -> list[dict[str, float]]:
        """Each clip's candidate languages' probabilities (summing to 1), in one CTranslate2 call on the batch.

        Whisper's language token after <|startoftranscript|>, on the encoder's output for the same trimmed window
        as ``transcribe_batch`` (``window_s``: a window of that many seconds instead; 30 is faster-whisper's own
        detection, which pads every clip to 30 s): one encoder pass and one decoder step, no VAD (a stream's
        utterance is speech already). An English-only model can only say English."""
        import ctranslate2

        if not audios:
            return []
        if not self.multilingual:
            return [among({"en": 1.0}, candidates) for _ in audios]
        n = window_samples(max(len(a) for a in audios)) if window_s is None else int(window_s * 16000)
        feats = self._trimmed(audios, min(n, 30 * 16000))
        with self._lock:
            encoded = self._model.model.encode(ctranslate2.StorageView.from_array(feats))
            ranked = self._model.model.detect_language(encoded)
        return [among({tok[2:-2]: float(p) for tok, p in r}, candidates) for r in ranked]

    def detect_language(self, audio: np.ndarray) -> tuple[str, float]:
        """Spoken language of (the speech in the first 30 s of) ``audio``; English-only models answer "en"."""
        if not self.multilingual:
            return "en", 1.0
        with self._lock:
            lang, prob, _all = self._model.detect_language(audio=audio[: 30 * 16000], vad_filter=True)
        return lang, float(prob)

    def transcribe(self, audio: np.ndarray, *, language: str | None, task: str = "transcribe",
                   initial_prompt: str | None = None, hotwords: str | None = None,
                   word_timestamps: bool = False) -> ASRResult:
        """``word_timestamps``: faster-whisper's own (cross-attention DTW per window), asked only when wanted: it
        runs an alignment pass over each window's tokens."""
        if not self.multilingual:
            language = "en"
            task = "transcribe"
        if language == "zh" and task == "transcribe" and not initial_prompt:
            initial_prompt = ZH_PROMPT
        with self._lock:
            segments, info = self._model.transcribe(
                audio, language=language, task=task, beam_size=self._beam, temperature=0.0,
                initial_prompt=initial_prompt, hotwords=hotwords, vad_filter=False,
                condition_on_previous_text=False, without_timestamps=False, word_timestamps=word_timestamps,
            )
            out: list[ASRSegment] = []
            for s in segments:
                text = s.text.strip()
                if not text:
                    continue
                conf = float(math.exp(s.avg_logprob)) * (1.0 - float(s.no_speech_prob))
                out.append(ASRSegment(start=float(s.start), end=float(s.end), text=text,
                                      confidence=round(min(1.0, max(0.0, conf)), 4), words=_words(s.words)))
        return ASRResult(text=" ".join(s.text for s in out).strip(), language=info.language, segments=out,
                         language_probability=float(info.language_probability))


def _words(words: list[Any] | None) -> list[ASRWord]:
    """faster-whisper's ``Word`` s as ours: the text without the space Whisper's tokens start with, times in
    seconds, ``probability`` rounded; a word that is only punctuation or space is dropped."""
    out = []
    for w in words or ():
        text = str(w.word).strip()
        if text:
            out.append(ASRWord(word=text, start=round(float(w.start), 3), end=round(float(w.end), 3),
                               probability=round(float(w.probability), 4)))
    return out
