"""MT on the continuous engine: a user's transformers model directory (Marian / OPUS-MT, M2M100, NLLB-200;
models/mt_local.py LocalDirMT) decoded by a GpuRunner, behind the same MT backend face as the CPU one.

``EngineMT.translate(texts, source, target)`` tokenizes with the directory's tokenizer, submits one item per text
to the runner and waits (on the caller's thread: the MT model thread of the executor, or a REST request's worker
thread, never the event loop) for every item, within ``timeout_s``. The registry serves it in place of the
LocalDirMT (``Registry.decode_mt_with``), so everything around the model is unchanged and shared: routes and
pivots, glossary placeholders and names (glossary.apply_mt_batch), the translation memory and its route keys
(serving/threads.py ``_mt``, files/translator.py). Batches of different language pairs, streams and REST requests
join one running batch on the model's runner.

Decoding is greedy, as ``generate(num_beams=1)`` with the model's generation config: its start token, stop
tokens, forced end-of-sentence at the length limit, single-token ``bad_words_ids`` and ``suppress_tokens``; the
target language's code (NLLB / M2M100 ``lang_codes``) is forced as the first token, as ``forced_bos_token_id``.
A config asking for what greedy decoding here does not do (repetition penalties, n-gram bans, a minimum length,
multi-token bad words) keeps the directory on its CPU backend (``greedy_plan`` says why). The CPU backend
searches two beams, so the engine's translation of a sentence may differ from the CPU one.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from ...config import Settings
from ...errors import ModelTimeout, Overloaded
from ...models.mt_local import MAX_NEW_TOKENS, LocalDirMT, new_token_limit
from .decoder_model import Decoded, DecoderModel
from .models import M2M100Decoder, MarianDecoder
from .recipes import encoder_outputs
from .runner import CpuPools, GpuRunner

log = logging.getLogger("lingua_fusion.gpu")

DECODERS: dict[str, type[MarianDecoder | M2M100Decoder]] = {  # mt_local.ENGINE_TYPES
    "marian": MarianDecoder, "m2m_100": M2M100Decoder}
CPU_POOLS = CpuPools(blocks=512, cross_blocks=256)  # 16-token / 64-token blocks: ~30 sentences at the length limit
CPU_MAX_BATCH = 64


@dataclass(frozen=True)
class GreedyPlan:
    """What ``generate(num_beams=1)`` does with a model's generation config, as the engine runs it."""

    start: int  # decoder_start_token_id
    stop: frozenset[int]  # eos_token_id(s)
    forced_eos: bool  # the last token allowed is end-of-sentence: one token fewer is decoded freely
    suppress: tuple[int, ...]  # never generated: suppress_tokens and single-token bad_words_ids
    suppress_first: tuple[int, ...]  # never the first generated token: begin_suppress_tokens
    forced_bos: int | None  # the first generated token, when the config forces one
    max_new: int = MAX_NEW_TOKENS  # generate's max_new_tokens: the config's, within mt_local's MAX_NEW_TOKENS


def greedy_plan(model: Any) -> GreedyPlan | str:
    """The plan for ``model``'s greedy decoding, or why the engine cannot reproduce it."""
    g = model.generation_config
    unsupported = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                   "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0,
                   "exponential_decay_length_penalty": None, "sequence_bias": None, "forced_decoder_ids": None}
    for name, neutral in unsupported.items():
        value = getattr(g, name, neutral)
        if value not in (neutral, None):
            return f"generation config sets {name}={value!r}"
    bad = [list(w) for w in (g.bad_words_ids or [])]
    if any(len(w) != 1 for w in bad):
        return "generation config has multi-token bad_words_ids"
    eos = g.eos_token_id if g.eos_token_id is not None else model.config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    start = g.decoder_start_token_id if g.decoder_start_token_id is not None else model.config.decoder_start_token_id
    if start is None or not eos_ids:
        return "no decoder start or end-of-sentence token"
    return GreedyPlan(start=int(start), stop=frozenset(int(e) for e in eos_ids),
                      forced_eos=g.forced_eos_token_id is not None,
                      suppress=tuple(int(t) for t in (g.suppress_tokens or [])) + tuple(int(w[0]) for w in bad),
                      suppress_first=tuple(int(t) for t in (g.begin_suppress_tokens or [])),
                      forced_bos=None if g.forced_bos_token_id is None else int(g.forced_bos_token_id),
                      max_new=new_token_limit(model))


@dataclass(frozen=True)
class MtTokens:
    """One text to decode: the encoder's input ids and the decoder's prompt."""

    ids: tuple[int, ...]
    prompt: tuple[int, ...]


class TorchSeq2SeqRecipe:
    """``Recipe`` (serving/gpu/runner.py) of a Hugging Face encoder-decoder over token ids: ``MtTokens`` -> the
    generated tokens (end-of-sentence left out)."""

    def __init__(self, model: Any, decoder: DecoderModel, plan: GreedyPlan) -> None:
        self.model, self.decoder, self.plan = model, decoder, plan
        self.stop = plan.stop
        self.pad = int(model.config.pad_token_id)
        self.device = next(model.parameters()).device
        # generate's max_new_tokens; with forced_eos the last of them is end-of-sentence, left out of the output
        self.max_new_tokens = plan.max_new - 1 if plan.forced_eos else plan.max_new

    def encode(self, payloads: list[MtTokens]) -> list[torch.Tensor]:
        return encoder_outputs(self.model.get_encoder(), [list(p.ids) for p in payloads], self.pad, self.device)

    def prompt(self, payload: MtTokens) -> list[int]:
        return list(payload.prompt)

    def max_new(self, payload: MtTokens) -> int:
        return max(1, self.max_new_tokens - (len(payload.prompt) - 1))  # a forced first token counts as generated

    def key(self, payload: MtTokens) -> bytes:
        """The same source text again (a repeated caption, another target of NLLB) reuses its encoder output."""
        return hashlib.blake2b(repr(payload.ids).encode(), digest_size=16).digest()

    def result(self, payload: MtTokens, decoded: Decoded) -> list[int]:
        return decoded.tokens


class EngineMT:
    """The MT backend face of ``LocalDirMT`` (``info``, ``translate``, ``close``) with the model decoded on a
    GpuRunner. Blocks its caller's thread until the batch is decoded (``timeout_s`` at most)."""

    def __init__(self, local: LocalDirMT, runner: GpuRunner, plan: GreedyPlan, *, timeout_s: float,
                 label: str) -> None:
        self.local, self.runner, self.plan = local, runner, plan
        self.timeout_s = timeout_s
        self.info = replace(local.info, name=f"{local.info.name}-continuous",
                            quality=f"{local.info.quality}; greedy on the continuous engine ({label})")

    def prompt(self, target: str) -> tuple[int, ...]:
        first = self.local.target_token(target)
        first = self.plan.forced_bos if first is None else first
        return (self.plan.start,) if first is None else (self.plan.start, first)

    def translate(self, texts: list[str], source: str, target: str) -> list[str]:
        self.local.check_pair(source, target)
        if not texts:
            return []
        prompt = self.prompt(target)
        items = [MtTokens(tuple(ids), prompt) for ids in self.local.token_ids(texts, source)]
        if self.runner.room() < len(items):
            raise Overloaded(f"the {self.info.name} engine queue is full", retry_after=0.5)
        futures = self.runner.submit(items, [False] * len(items))
        done, late = concurrent.futures.wait(futures, timeout=self.timeout_s)
        if late:
            for f in late:
                f.cancel()  # its decode ends on its own (at the length limit at most); the result is dropped
            raise ModelTimeout(f"{self.info.name} gave no translation in {self.timeout_s:.0f} s")
        return self.local.detokenize([f.result() for f in futures])

    def close(self) -> None:
        self.runner.close()


MT_POOL_SHARE = 0.25  # of this process's pool memory (ASR's runner takes the rest: serving/gpu/torch_whisper.py)


def mt_runner(model: Any, decoder: DecoderModel, plan: GreedyPlan, settings: Settings, name: str) -> GpuRunner:
    """A GpuRunner decoding ``model`` (already on ``models.device``)."""
    device = settings.models.device
    recipe = TorchSeq2SeqRecipe(model, decoder, plan)
    dtype = next(model.parameters()).dtype
    if device.startswith("cuda"):
        return GpuRunner.sized(recipe, fraction=settings.models.gpu_memory_fraction, device=device, dtype=dtype,
                               share=settings.models.gpu_memory_share * MT_POOL_SHARE, name=name,
                               graphs=settings.models.step_graphs, max_batch=settings.models.engine_max_batch,
                               encode_batch=min(128, settings.models.engine_max_batch),
                               gather_s=settings.models.engine_gather_ms / 1000,
                               overlap=settings.models.step_overlap)
    return GpuRunner(recipe, dtype=dtype, device=device, name=name, memo=64, **CPU_POOLS,
                     max_batch=min(CPU_MAX_BATCH, settings.models.engine_max_batch),
                     encode_batch=min(16, settings.models.engine_max_batch))


def engine_mt(local: LocalDirMT, settings: Settings, name: str) -> EngineMT | None:
    """``local``'s model on the engine, or None (logged) where the engine cannot decode it as ``generate`` would."""
    model = local.model
    plan = "a CTranslate2 directory" if model is None else greedy_plan(model)
    arch = None if model is None else DECODERS.get(model.config.model_type)
    if isinstance(plan, str) or arch is None:
        why = plan if isinstance(plan, str) else f"no engine decoder for {model.config.model_type}"
        log.warning("%s stays on its CPU backend: %s", local.info.name, why)
        return None
    # float16 on CUDA, as the engine's Whisper (models/asr_whisper_torch.py) and the GPU harness; float32 on the CPU.
    # A user's OPUS-MT directory is float32: kept so on the H200, its MT stage's p99 (24 tokens) went over the
    # interactive class's MT share, 0.3 s (bench/results/gpu_product.json, the first run)
    device = settings.models.device
    model.to(device=device, dtype=torch.float16 if device.startswith("cuda") else torch.float32)
    decoder = arch(model, suppress=plan.suppress, suppress_first=plan.suppress_first)
    runner = mt_runner(model, decoder, plan, settings, name)
    log.info("%s (%s) on the continuous engine (%s)", name, local.info.name, settings.models.device)
    return EngineMT(local, runner, plan, timeout_s=settings.server.request_timeout_s, label=settings.models.device)
