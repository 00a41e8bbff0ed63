"""Whisper ASR in torch (models.backend = "torch"): the same weights, methods and meaning as WhisperASR.

``transcribe_batch`` is WhisperASR.transcribe_batch (trimmed windows by ``window_samples``, prompts, no timestamps,
temperature 0, no-repeat 4-grams, the same confidence, collapse_repeats), except that each clip gets its own window
and token budget instead of the batch's longest: a clip's text does not depend on what it is batched with.
``transcribe`` is faster-whisper's ``transcribe`` as WhisperASR calls it (30 s windows, timestamp tokens, seeking by
them, temperature 0 without fallback, no-speech skip, no VAD, no conditioning on previous text).
Runs in float32 on the CPU, float16 on CUDA.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import BackendError, NotConfigured
from .asr_whisper import ZH_PROMPT, caption_text, decode_length, window_samples
from .base import ASRResult, ASRSegment, BackendInfo, among
from .host_copy import queued_copy
from .transcript_guard import heard_nothing, mean_logprob
from .whisper_decode import Decoded, DecodeOptions, SpecialTokens, greedy_decode
from .whisper_torch import LogMel, WhisperTorch, load_whisper
from .word_times import WORDS_NEED_CT2

SR = 16000
WINDOW_FRAMES = 3000  # Whisper's 30 s window in mel frames
MAX_LENGTH = 448  # faster-whisper's max_length for transcribe
TIME_PRECISION = 0.02  # seconds per timestamp token / per encoder frame


def load_tokenizer(model_dir: Path) -> Any:
    """The model directory's tokenizer.json (wrap it in faster-whisper's Tokenizer per language and task)."""
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def build_prompt(tok: Any, previous: list[int], *, timestamps: bool, hotwords: str | None = None) -> list[int]:
    """faster-whisper's WhisperModel.get_prompt (no prefix)."""
    prompt: list[int] = []
    half = MAX_LENGTH // 2
    if previous or hotwords:
        prompt.append(tok.sot_prev)
        if hotwords:
            prompt.extend(tok.encode(" " + hotwords.strip())[: half - 1])
        if previous:
            prompt.extend(previous[-(half - 1):])
    prompt.extend(tok.sot_sequence)
    if not timestamps:
        prompt.append(tok.no_timestamps)
    return prompt


class WhisperTorchASR:
    def __init__(self, model_dir: Path, info: BackendInfo, *, device: str = "cpu", threads: int = 2) -> None:
        try:
            dtype = torch.float16 if device.startswith("cuda") else torch.float32
            if device == "cpu":
                torch.set_num_threads(threads)
            self.model: WhisperTorch = load_whisper(model_dir, device=device, dtype=dtype)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise BackendError(f"cannot load Whisper model from {model_dir} into torch: {exc}") from exc
        self.info = info
        self.device = torch.device(device)
        self.model_dir = Path(model_dir)
        self.multilingual = self.model.is_multilingual
        self.mel = LogMel(self.model.dims.n_mels).to(self.device)
        self._lock = threading.Lock()  # one decode at a time: torch uses the cores itself
        self._hf_tokenizer = load_tokenizer(self.model_dir)
        self._tokenizers: dict[tuple[str, str], Any] = {}
        tok = self.tokenizer("en")
        self.special = SpecialTokens(sot=tok.sot, eot=tok.eot, no_timestamps=tok.no_timestamps,
                                     no_speech=tok.no_speech, n_vocab=self.model.dims.n_vocab)

    def tokenizer(self, language: str | None, task: str = "transcribe") -> Any:
        """faster-whisper's Tokenizer for (language, task), made once."""
        from faster_whisper.tokenizer import Tokenizer

        key = (language or "en", task)
        if key not in self._tokenizers:
            self._tokenizers[key] = Tokenizer(self._hf_tokenizer, self.multilingual, task=task,
                                              language=key[0] if self.multilingual else None)
        return self._tokenizers[key]

    # ---- encoder ---------------------------------------------------------------------------------------------
    def _features(self, audio: np.ndarray) -> torch.Tensor:
        """Log-mel of one clip, [n_mels, len/160 + 1] (faster-whisper's FeatureExtractor, padding=160)."""
        x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).to(self.device)
        return self.mel(x[None])[0]

    def _encode(self, windows: list[np.ndarray], widths: list[int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode zero-padded windows (lengths multiples of 2 s): each row as if alone. -> (xa, frames)."""
        mel, frames = self.mels(windows, widths)
        with torch.no_grad():
            xa = self.model.embed_audio(mel, frames)
        return xa, frames

    def mels(self, windows: list[np.ndarray], widths: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's input for zero-padded windows (``widths``: each window's samples, its audio the first of
        them and zeros after; None: the arrays are the windows): log-mel [batch, n_mels, longest] in the model's
        dtype (zeros past each window) and each window's length in mel frames [batch], both on the device."""
        lengths = [n // 160 for n in (widths if widths is not None else [len(w) for w in windows])]
        # one copy and one STFT for the batch (LogMel.ragged: each row its own window's, zeros past its frames,
        # of which it has one more than the encoder takes: cut here)
        mel, _ = self.mel.ragged(windows, widths)
        frames = queued_copy(torch.tensor(lengths, dtype=torch.long), self.device)
        mel = mel[:, :, : max(lengths)]
        mel = mel.masked_fill(torch.arange(mel.shape[-1], device=self.device) >= frames[:, None, None], 0.0)
        return mel.to(self.model.decoder.token_embedding.weight.dtype), frames

    # ---- streaming clips -------------------------------------------------------------------------------------
    def transcribe_batch(self, audios: list[np.ndarray], *, language: str | None,
                         prompts: list[str | None] | None = None, max_new_tokens: int = 160) -> list[tuple[str, float]]:
        """Decode several short clips in one batch. Returns (text, confidence) each, as WhisperASR."""
        pairs = self.decode_clips(audios, language=language, prompts=prompts, max_new_tokens=max_new_tokens)
        return [(caption_text(text), conf) for text, conf in pairs]

    def decode_clips(self, audios: list[np.ndarray], *, language: str | None, prompts: list[str | None] | None = None,
                     max_new_tokens: int = 160, min_window_s: float | None = None, pad_s: float | None = None
                     ) -> list[tuple[str, float]]:
        """``transcribe_batch`` before its repetition guard, with the window rule's parameters (``window_samples``;
        min_window_s=30 puts every clip in a full 30 s window, as faster-whisper's own transcribe)."""
        if not audios:
            return []
        lang = "en" if not self.multilingual else (language or "en")
        tok = self.tokenizer(lang)
        widths = [window_samples(len(a), min_window_s, pad_s) for a in audios]
        clips = window_tails(audios, widths)
        token_prompts, budgets = [], []
        for i, a in enumerate(audios):
            text = (prompts[i] if prompts else None) or (ZH_PROMPT if lang == "zh" else None)
            prev = tok.encode(" " + text.strip())[-100:] if text else []
            token_prompts.append(build_prompt(tok, prev, timestamps=False))
            # ~5 tokens per second of speech (CTranslate2 then allows half of this, less the prompt)
            budgets.append(decode_length(min(max_new_tokens, int(8 * len(a) / SR) + 16), len(token_prompts[-1]) - 1))
        opts = DecodeOptions(suppress=self.model.gen.suppress_ids, suppress_begin=self.model.gen.suppress_ids_begin,
                             no_repeat_ngram=4)
        with self._lock:
            xa, frames = self._encode(clips, widths)
            results = greedy_decode(self.model, xa, frames, token_prompts, budgets, self.special, opts)
        # Whisper's own no-speech rule, as WhisperASR.transcribe_batch (models/transcript_guard.py)
        return [("" if heard_nothing(r.no_speech_prob, mean_logprob(r.score, len(r.tokens)))
                 else tok.decode(r.tokens).strip(), _confidence(r)) for r in results]

    # ---- files -----------------------------------------------------------------------------------------------
    def _language_probs(self, xa: torch.Tensor) -> list[tuple[str, float]]:
        lang_ids = list(self.model.gen.lang_ids)
        cache = self.model.decoder.start(xa)
        sot = torch.tensor([[self.special.sot]], device=self.device)
        with torch.no_grad():
            logits = self.model.decoder.logits(self.model.decoder(sot, torch.zeros_like(sot), cache)[:, -1])
        probs = torch.softmax(logits[0, lang_ids], dim=-1).tolist()
        tok = self.tokenizer("en")
        names = [tok.tokenizer.id_to_token(i)[2:-2] for i in lang_ids]
        return sorted(zip(names, probs, strict=True), key=lambda p: -p[1])

    def _encode_window(self, feats: torch.Tensor, seek: int, size: int) -> torch.Tensor:
        seg = torch.zeros(self.model.dims.n_mels, WINDOW_FRAMES, device=self.device)
        seg[:, :size] = feats[:, seek: seek + size]
        with torch.no_grad():
            return self.model.embed_audio(seg[None].to(self.model.decoder.token_embedding.weight.dtype))

    def detect_language(self, audio: np.ndarray) -> tuple[str, float]:
        """Spoken language of (the speech in the first 30 s of) ``audio``; English-only models answer "en"."""
        if not self.multilingual:
            return "en", 1.0
        from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

        chunks, _meta = collect_chunks(audio, get_speech_timestamps(audio, VadOptions()))
        speech = np.concatenate(chunks)
        speech = speech if speech.size else audio  # no speech found: look at all of it
        feats = self._features(speech[: 30 * SR])
        with self._lock:
            lang, prob = self._language_probs(self._encode_window(feats, 0, min(WINDOW_FRAMES, feats.shape[1])))[0]
        return lang, float(prob)

    def detect_batch(self, audios: list[np.ndarray], candidates: Sequence[str], *,
                     window_s: float | None = None) -> list[dict[str, float]]:
        """WhisperASR.detect_batch: each clip's candidate languages' probabilities (summing to 1), from the
        language token's logits, one clip at a time on a 30 s window (this backend's ``_encode_window``; the
        zeros after the clip are what a trimmed window also holds, so ``window_s`` changes nothing here)."""
        if not self.multilingual:
            return [among({"en": 1.0}, candidates) for _ in audios]
        out = []
        for a in audios:
            feats = self._features(a[-30 * SR:])
            with self._lock:
                probs = self._language_probs(self._encode_window(feats, 0, min(WINDOW_FRAMES, feats.shape[1])))
            out.append(among(dict(probs), candidates))
        return out

    def transcribe(self, audio: np.ndarray, *, language: str | None, task: str = "transcribe",
                   initial_prompt: str | None = None, hotwords: str | None = None,
                   word_timestamps: bool = False) -> ASRResult:
        """``word_timestamps``: not in this port (it has no cross-attention alignment pass): ``NotConfigured``,
        which files/validate.py also answers before any work when ``models.backend`` is torch."""
        if word_timestamps:
            raise NotConfigured(WORDS_NEED_CT2, details={"field": "word_timestamps"})
        if not self.multilingual:
            language, task = "en", "transcribe"
        if language == "zh" and task == "transcribe" and not initial_prompt:
            initial_prompt = ZH_PROMPT
        with self._lock:
            feats = self._features(audio)
            content = feats.shape[1] - 1
            language_probability = 1.0
            if language is None:
                xa = self._encode_window(feats, 0, min(WINDOW_FRAMES, feats.shape[1]))
                language, language_probability = self._language_probs(xa)[0]
            segments = self._segments(feats, content, language, task, initial_prompt, hotwords)
        return ASRResult(text=" ".join(s.text for s in segments).strip(), language=language, segments=segments,
                         language_probability=float(language_probability))

    def _segments(self, feats: torch.Tensor, content: int, language: str, task: str,
                  initial_prompt: str | None, hotwords: str | None) -> list[ASRSegment]:
        """faster-whisper's generate_segments for WhisperASR's options (seek by timestamps, 30 s windows)."""
        tok = self.tokenizer(language, task)
        suppress = sorted(set(tok.non_speech_tokens) | {tok.transcribe, tok.translate, tok.sot, tok.sot_prev,
                                                        tok.sot_lm, tok.no_speech})
        opts = DecodeOptions(suppress=tuple(suppress), suppress_begin=self.model.gen.suppress_ids_begin)
        previous = tok.encode(" " + initial_prompt.strip()) if initial_prompt else []
        out: list[ASRSegment] = []
        seek = 0
        while seek < content:
            size = min(WINDOW_FRAMES, content - seek)
            xa = self._encode_window(feats, seek, size)
            prompt = build_prompt(tok, previous, timestamps=True, hotwords=hotwords)
            previous = []  # condition_on_previous_text=False: the initial prompt serves the first window only
            res = greedy_decode(self.model, xa, None, [prompt], [MAX_LENGTH], self.special, opts)[0]
            avg_logprob = res.logprob_sum / (len(res.tokens) + 1)
            if res.no_speech_prob > 0.6 and avg_logprob <= -1.0:  # silent window: skip it
                seek += size
                continue
            pieces, seek = _split_by_timestamps(res.tokens, tok.timestamp_begin, seek, size)
            conf = round(min(1.0, max(0.0, math.exp(avg_logprob) * (1.0 - res.no_speech_prob))), 4)
            for start, end, tokens in pieces:
                text = tok.decode(tokens).strip()
                if start != end and text:
                    out.append(ASRSegment(start=start, end=end, text=text, confidence=conf))
        return out


def _confidence(r: Decoded) -> float:
    """WhisperASR.transcribe_batch's confidence from CTranslate2's score (its mean log-prob / length, kept as is)."""
    avg_logprob = r.score / max(1, len(r.tokens))
    conf = math.exp(min(0.0, avg_logprob)) * (1.0 - r.no_speech_prob) if avg_logprob > -math.inf else 0.0
    return round(min(1.0, max(0.0, conf)), 4)


def _split_by_timestamps(tokens: list[int], ts_begin: int, seek: int, size: int
                         ) -> tuple[list[tuple[float, float, list[int]]], int]:
    """faster-whisper's _split_segments_by_timestamps: (start, end, tokens) pieces and the next seek (frames)."""
    offset = seek * 0.01
    single_end = len(tokens) >= 2 and tokens[-2] < ts_begin <= tokens[-1]
    cuts = [i for i in range(1, len(tokens)) if tokens[i] >= ts_begin and tokens[i - 1] >= ts_begin]
    if not cuts:
        stamps = [t for t in tokens if t >= ts_begin]
        duration = size * 0.01
        if stamps and stamps[-1] != ts_begin:
            duration = (stamps[-1] - ts_begin) * TIME_PRECISION
        return [(offset, offset + duration, tokens)], seek + size
    pieces = []
    last = 0
    for cut in cuts + ([len(tokens)] if single_end else []):
        part = tokens[last:cut]
        pieces.append((offset + (part[0] - ts_begin) * TIME_PRECISION,
                       offset + (part[-1] - ts_begin) * TIME_PRECISION, part))
        last = cut
    if single_end:
        return pieces, seek + size
    return pieces, seek + (tokens[last - 1] - ts_begin) * 2


def window_tails(audios: Sequence[np.ndarray], widths: list[int]) -> list[np.ndarray]:
    """Each clip's audio in its window of ``widths[i]`` samples: its last that many (float32, no copy where it is
    already), zeros after it left to ``mels``."""
    out = []
    for a, n in zip(audios, widths, strict=True):
        a = np.asarray(a, dtype=np.float32)
        out.append(a[-n:] if len(a) > n else a)
    return out
