"""Recipes (serving/gpu/runner.py Recipe): what the GPU runner needs of each model family.

``WhisperRecipe``: ASR, ``AsrInput`` -> ``AsrOutput``: a log-mel per clip, the encoder on the batch's longest
clip rounded up to 1 s (the positional table cut, not Whisper's padded 30 s window), greedy decoding.
``Seq2SeqTextRecipe``: MT (Marian / OPUS-MT), ``MtInput`` -> ``str`` (the GPU benchmark's). The server's MT
recipe is serving/gpu/torch_mt.py's; both run the encoder through ``encoder_outputs``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...models.host_copy import queued_copy
from ...types import SR
from ..ports import AsrInput, AsrOutput, MtInput
from .decoder_model import Decoded, DecoderModel
from .hf_encoders import device_only
from .memo import audio_key, audio_prefilter

MEL_FRAMES_PER_S = 100
Mels = Callable[[list[np.ndarray]], tuple[torch.Tensor, list[int]]]  # clips -> ([B, n_mels, frames], frames each)


def confidence(logprobs: list[float]) -> float:
    return float(math.exp(sum(logprobs) / len(logprobs))) if logprobs else 0.0


def hf_whisper_encoder(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hugging Face Whisper's encoder on trimmed windows: [batch, n_mels, frames] -> [batch, frames / 2, d]."""
    enc = model.model.encoder

    def encode(mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(enc.conv2(F.gelu(enc.conv1(mel)))).transpose(1, 2)
        x = x + enc.embed_positions.weight[: x.shape[1]]
        for layer in enc.layers:
            out = layer(x, attention_mask=None)
            x = out[0] if isinstance(out, tuple) else out
        normed: torch.Tensor = enc.layer_norm(x)  # a transformers module: its call is untyped
        return normed

    return encode


def encoder_outputs(encoder: Any, ids: list[list[int]], pad: int, device: torch.device) -> list[torch.Tensor]:
    """A Hugging Face text encoder on a padded batch of token ids (padding masked): each row's output
    [len(ids[i]), d_model], as ``generate`` computes it for the same batch."""
    batch, mask = padded_ids(ids, pad)
    width = batch.shape[1]
    # no padding: no mask (what the encoder would decide itself, after reading the mask back from the device)
    padded = queued_copy(mask, device) if any(len(seq) < width for seq in ids) else None
    with torch.inference_mode():
        hidden = device_only(encoder)(input_ids=queued_copy(batch, device), attention_mask=padded).last_hidden_state
    return [hidden[i, : len(seq)] for i, seq in enumerate(ids)]


def marian_encoder(model: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Hugging Face Marian's encoder on ids [batch, width] and their mask (1 = token, 0 = padding), with no read of
    the device on the host, so one CUDA graph can hold it: the mask is always passed, as the [batch, 1, width,
    width] mask Hugging Face builds for a padded batch (boolean for sdpa, additive for its eager attention; for an
    unpadded batch it passes none: the same attention, other kernels), and the layers keep their float16 guard on
    the device (``device_only``)."""
    enc = device_only(model.model.encoder)
    sdpa = getattr(model.config, "_attn_implementation", "sdpa") == "sdpa"

    def encode(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, width = ids.shape
        x: torch.Tensor = enc.embed_tokens(ids) * enc.embed_scale + enc.embed_positions.weight[:width]
        attend = mask.bool()[:, None, None, :].expand(n, 1, width, width)
        if not sdpa:  # the eager attention adds its mask to the scores: 0 where it may look, the dtype's minimum not
            attend = torch.zeros(attend.shape, dtype=x.dtype, device=x.device).masked_fill(
                ~attend, torch.finfo(x.dtype).min)
        for layer in enc.layers:
            x = layer(x, attend)  # a transformers module: its call is untyped
        return x

    return encode


def padded_ids(ids: list[list[int]], pad: int, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [batch, width] padded with ``pad`` to the longest rounded up to ``multiple``, and the mask."""
    width = -(-max(len(i) for i in ids) // multiple) * multiple
    batch = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return batch, mask


class WhisperRecipe:
    def __init__(self, decoder: DecoderModel, *, encode: Callable[[torch.Tensor], torch.Tensor],
                 mel: Callable[[torch.Tensor], torch.Tensor], prompt: Callable[[str | None], list[int]],
                 text: Callable[[list[int]], str], stop: frozenset[int], device: torch.device | str,
                 dtype: torch.dtype, tokens_per_s: float | None = None, max_tokens: int = 128,
                 pad_to_s: float | None = None, mels: Mels | None = None) -> None:
        self.decoder = decoder
        self.stop = stop
        self._encode, self._mel, self._prompt, self._text = encode, mel, prompt, text
        self._mels = mels  # every clip of a batch in one call (LogMel.ragged), else ``mel`` clip by clip
        self.device, self.dtype = torch.device(device), dtype
        self.tokens_per_s = tokens_per_s  # random weights never say end-of-text: cap at a real speech rate
        self.max_tokens = max_tokens
        self.pad_to_s = pad_to_s  # the per-stream baseline: every clip padded to Whisper's 30 s window

    def encode(self, payloads: list[AsrInput]) -> list[torch.Tensor]:
        with torch.inference_mode():
            if self._mels is not None:
                mel, frames = self._mels([p.audio for p in payloads])
            else:
                one = [self._mel(torch.from_numpy(np.ascontiguousarray(p.audio)).to(self.device)) for p in payloads]
                frames = [m.shape[-1] for m in one]
                mel = torch.stack([F.pad(m, (0, max(frames) - m.shape[-1])) for m in one])
            width = -(-max(frames) // MEL_FRAMES_PER_S) * MEL_FRAMES_PER_S  # the longest clip, rounded up to 1 s
            if self.pad_to_s is not None:
                width = max(width, int(self.pad_to_s * MEL_FRAMES_PER_S))
            out = self._encode(F.pad(mel, (0, width - mel.shape[-1])).to(self.dtype))
        return [out[i, : -(-n // 2)] for i, n in enumerate(frames)]

    def prompt(self, payload: AsrInput) -> list[int]:
        return self._prompt(payload.prompt)

    def max_new(self, payload: AsrInput) -> int:
        if self.tokens_per_s is None:
            return self.max_tokens
        return min(self.max_tokens, int(len(payload.audio) / SR * self.tokens_per_s) + 4)

    def key(self, payload: AsrInput) -> bytes:
        return audio_key(np.asarray(payload.audio))

    def prefilter(self, payload: AsrInput) -> bytes:
        """Its window's length and 64 of its samples: a commit is hashed in full only where a partial's matched."""
        return audio_prefilter(np.asarray(payload.audio))

    def result(self, payload: AsrInput, decoded: Decoded) -> AsrOutput:
        return AsrOutput(self._text(decoded.tokens).strip(), min(1.0, confidence(decoded.logprobs)))


class Seq2SeqTextRecipe:
    """MT with a Hugging Face encoder-decoder (``model.model.encoder``), e.g. MarianMTModel."""

    def __init__(self, model: Any, decoder: DecoderModel, *, tokenize: Callable[[str], list[int]],
                 detokenize: Callable[[list[int]], str], start: int, stop: frozenset[int], pad: int,
                 device: torch.device | str, length_ratio: float | None = None, max_tokens: int = 256,
                 padded_encode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 width_multiple: int = 8) -> None:
        self.model, self.decoder, self.stop = model, decoder, stop
        # ``marian_encoder``'s call (or CUDA graphs of it, serving/gpu/encoder_graphs.py) on ids padded to a
        # multiple of ``width_multiple`` tokens, instead of Hugging Face's encoder through ``encoder_outputs``
        self._padded_encode, self._width_multiple = padded_encode, width_multiple
        self._tok, self._detok, self._start, self._pad = tokenize, detokenize, start, pad
        self.device = torch.device(device)
        self.length_ratio = length_ratio  # random weights never say end-of-sentence: cap at the source length
        self.max_tokens = max_tokens

    def encode(self, payloads: list[MtInput]) -> list[torch.Tensor]:
        ids = [self._tok(p.text)[: self.max_tokens] or [self._pad] for p in payloads]
        if self._padded_encode is None:
            return encoder_outputs(self.model.model.encoder, ids, self._pad, self.device)
        batch, mask = padded_ids(ids, self._pad, self._width_multiple)
        with torch.inference_mode():
            hidden = self._padded_encode(queued_copy(batch, self.device), queued_copy(mask, self.device))
        return [hidden[i, : len(seq)] for i, seq in enumerate(ids)]

    def prompt(self, payload: MtInput) -> list[int]:
        return [self._start]

    def max_new(self, payload: MtInput) -> int:
        if self.length_ratio is None:
            return self.max_tokens
        return min(self.max_tokens, int(len(self._tok(payload.text)) * self.length_ratio) + 4)

    def key(self, payload: MtInput) -> None:
        return None

    def result(self, payload: MtInput, decoded: Decoded) -> str:
        return self._detok(decoded.tokens)
