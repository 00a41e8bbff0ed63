"""``TorchWhisperRecipe``: the GPU runner's Recipe (serving/gpu/runner.py) over the torch Whisper backend
(models/asr_whisper_torch.py WhisperTorchASR): its ``decode_clips`` step by step: the same trimmed windows
(``window_samples``), log-mel and masked encoder call, prompt, token budget, suppressed tokens and text clean-up
(``collapse_repeats``), so a clip's greedy transcript is the torch backend's. Decoding differs in one rule: no
4-gram repeat ban (the engine's sampler is plain greedy), which only matters for a decoder loop. On CUDA the
encoder call replays from CUDA graphs (``encoder_graphs``: the same call with its mask always passed, one launch a
batch instead of one per operator); in float16 its outputs may differ from the plain call's in the last bits (other
attention and matrix kernels for the masked, bucket-padded batch), so transcripts are equal there up to that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...config import Settings
from ...models.asr_whisper import ZH_PROMPT, caption_text, window_samples
from ...types import SR
from ..ports import AsrInput, AsrOutput
from .decoder_model import Decoded
from .encoder_graphs import EncoderGraphs
from .graphs import buckets_up_to
from .memo import audio_key, audio_prefilter
from .models import WhisperDecoder
from .recipes import confidence
from .runner import CpuPools, GpuRunner

log = logging.getLogger("lingua_fusion.gpu")

CPU_POOLS = CpuPools(blocks=512, cross_blocks=256)  # 16-token / 64-frame blocks: ~40 clips of 10 s on tiny.en
CPU_MAX_BATCH = 32
ENCODE_BATCH = 128  # windows per encoder batch on CUDA (GpuRunner's default), the largest graph bucket
ASR_POOL_SHARE = 0.75  # of this process's pool memory; a user MT directory's runner takes the rest (torch_mt.py)


class TorchWhisperRecipe:
    """``Recipe`` over ``WhisperTorchASR`` (models/asr_whisper_torch.py): its ``decode_clips`` step by step."""

    def __init__(self, asr: Any, language: str, max_new_tokens: int = 160,
                 encoder: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        from ...models.asr_whisper_torch import build_prompt, window_tails

        self.asr = asr
        self.encoder = encoder  # (mel, frames) -> encoder output: CUDA graphs of it (``encoder_graphs``), or None
        self.lang = "en" if not asr.multilingual else language
        self.tok = asr.tokenizer(self.lang)
        gen = asr.model.gen
        self.decoder = WhisperDecoder(asr.model, suppress=gen.suppress_ids, suppress_first=gen.suppress_ids_begin)
        self.stop = frozenset({self.tok.eot})
        self.max_new_tokens = max_new_tokens
        self._build_prompt = build_prompt
        self._tails = window_tails

    def encode(self, payloads: list[AsrInput]) -> list[torch.Tensor]:
        widths = [window_samples(len(p.audio)) for p in payloads]
        clips = self._tails([p.audio for p in payloads], widths)
        with self.asr._lock, torch.inference_mode():  # the torch backend's own encoder call (masked, trimmed)
            if self.encoder is None:
                xa, _frames = self.asr._encode(clips, widths)
            else:
                xa = self.encoder(*self.asr.mels(clips, widths))
        return [xa[i, : (n // 160) // 2] for i, n in enumerate(widths)]  # 160 samples a mel frame, 2 a row

    def prompt(self, payload: AsrInput) -> list[int]:
        text = payload.prompt or (ZH_PROMPT if self.lang == "zh" else None)
        prev = self.tok.encode(" " + text.strip())[-100:] if text else []
        return self._build_prompt(self.tok, prev, timestamps=False)

    def max_new(self, payload: AsrInput) -> int:
        # the torch backend's budget (CTranslate2's max_length: half of it, less the tokens before the start token)
        budget = min(self.max_new_tokens, int(8 * len(payload.audio) / SR) + 16)
        return max(1, min(budget // 2, budget - (len(self.prompt(payload)) - 1)))

    def key(self, payload: AsrInput) -> bytes:
        return audio_key(np.asarray(payload.audio))

    def prefilter(self, payload: AsrInput) -> bytes:
        """Its window's length and 64 of its samples: a commit is hashed in full only where a partial's matched."""
        return audio_prefilter(np.asarray(payload.audio))

    def result(self, payload: AsrInput, decoded: Decoded) -> AsrOutput:
        text = caption_text(self.tok.decode(decoded.tokens))
        return AsrOutput(text, round(min(1.0, confidence(decoded.logprobs)), 4))


def encoder_graphs(asr: Any, batches: list[int]) -> EncoderGraphs:
    """``asr``'s encoder (always masked: no host read) replayed from CUDA graphs, for every window width the recipe
    makes (``window_samples``: 2 s steps up to 30 s) and batch bucket, captured by ``capture_ahead`` (on the
    runner's thread: ``GpuRunner(prepare=...)``)."""
    encoder = asr.model.encoder
    dtype = asr.model.decoder.token_embedding.weight.dtype
    n_mels = asr.model.dims.n_mels
    return EncoderGraphs(lambda mel, frames: encoder(mel, frames, always_mask=True), batches, asr.device,
                         ahead=[[((n_mels, width), dtype), ((), torch.long)] for width in range(200, 3001, 200)])


def asr_runner(asr: Any, language: str, settings: Settings, name: str) -> GpuRunner:
    """A GpuRunner decoding ``asr``'s model (a loaded WhisperTorchASR) for ``language``; on CUDA its encoder runs
    from CUDA graphs when ``models.encoder_graphs`` is set."""
    device = settings.models.device
    graphs = None
    encode_batch = min(ENCODE_BATCH, settings.models.engine_max_batch)
    if device.startswith("cuda") and settings.models.encoder_graphs:
        graphs = encoder_graphs(asr, buckets_up_to(encode_batch, smallest=1))
    recipe = TorchWhisperRecipe(asr, language, encoder=graphs)
    dtype = asr.model.decoder.token_embedding.weight.dtype
    if device.startswith("cuda"):
        def capture() -> None:  # on the runner's thread, before it serves
            nonlocal graphs
            try:
                if graphs is not None:
                    graphs.capture_ahead()
            except RuntimeError as exc:  # a CUDA build or driver that cannot capture: one launch per operator
                log.warning("%s: CUDA graphs of the Whisper encoder failed (%s); it runs without them", name, exc)
                recipe.encoder = graphs = None  # what was captured before the failure goes with them
                torch.cuda.empty_cache()

        return GpuRunner.sized(recipe, fraction=settings.models.gpu_memory_fraction, device=device, dtype=dtype,
                               share=settings.models.gpu_memory_share * ASR_POOL_SHARE, name=name,
                               encode_batch=encode_batch, max_batch=settings.models.engine_max_batch,
                               prepare=[capture], graphs=settings.models.step_graphs,
                               gather_s=settings.models.engine_gather_ms / 1000,
                               overlap=settings.models.step_overlap)
    return GpuRunner(recipe, dtype=dtype, device=device, name=name, encode_batch=min(8, encode_batch),
                     max_batch=min(CPU_MAX_BATCH, settings.models.engine_max_batch), memo=64, **CPU_POOLS)
