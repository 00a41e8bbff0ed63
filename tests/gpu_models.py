"""Tiny models of the real architectures, with random weights, for the GPU engine's CPU tests, and the dense
reference decoding every paged / batched path is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from lingua_fusion.serving.gpu.recipes import WhisperRecipe


@dataclass
class Dims:
    n_vocab: int = 97
    n_text_ctx: int = 64
    n_text_state: int = 32
    n_text_head: int = 4
    n_text_layer: int = 2


class Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.query, self.key, self.value, self.out = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d), \
            nn.Linear(d, d)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn_ln, self.attn = nn.LayerNorm(d), Attention(d)
        self.cross_attn_ln, self.cross_attn = nn.LayerNorm(d), Attention(d)
        self.mlp_ln, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


class Decoder(nn.Module):
    def __init__(self, dims: Dims) -> None:
        super().__init__()
        d = dims.n_text_state
        self.token_embedding = nn.Embedding(dims.n_vocab, d)
        self.positional_embedding = nn.Parameter(torch.randn(dims.n_text_ctx, d) * 0.1)
        self.blocks = nn.ModuleList(Block(d) for _ in range(dims.n_text_layer))
        self.ln = nn.LayerNorm(d)


class TinyWhisper(nn.Module):
    """Only the decoder half: the engine's tests give it encoder outputs directly."""

    def __init__(self, dims: Dims | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.dims = dims or Dims()
        self.decoder = Decoder(self.dims)
        self.eval()


def _attend(attn: Attention, x: torch.Tensor, mem: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    t, d = x.shape
    q = attn.query(x).view(t, heads, -1).transpose(0, 1)
    k = attn.key(mem).view(mem.shape[0], heads, -1).transpose(0, 1)
    v = attn.value(mem).view(mem.shape[0], heads, -1).transpose(0, 1)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attn.out(a.transpose(0, 1).reshape(t, d))


@torch.inference_mode()
def reference_greedy(model: TinyWhisper, memory: torch.Tensor, prompt: list[int], max_new: int,
                     stop: frozenset[int]) -> list[int]:
    """One sequence, no cache: the whole decoder over every token at every step."""
    dec, heads = model.decoder, model.dims.n_text_head
    tokens = list(prompt)
    out: list[int] = []
    while len(out) < max_new and len(tokens) < model.dims.n_text_ctx:
        ids = torch.tensor(tokens)
        x = dec.token_embedding(ids) + dec.positional_embedding[: len(tokens)]
        for blk in dec.blocks:
            h = blk.attn_ln(x)
            x = x + _attend(blk.attn, h, h, heads, causal=True)
            x = x + _attend(blk.cross_attn, blk.cross_attn_ln(x), memory, heads, causal=False)
            x = x + blk.mlp(blk.mlp_ln(x))
        tok = int((dec.ln(x[-1]) @ dec.token_embedding.weight.T).argmax())
        if tok in stop:
            break
        out.append(tok)
        tokens.append(tok)
    return out


IDS = {"pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 3, "decoder_start_token_id": 2}


def hf_whisper(seed: int = 0, n_mels: int = 8) -> torch.nn.Module:
    """A tiny Hugging Face Whisper (the real architecture, random weights)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    cfg = WhisperConfig(vocab_size=97, num_mel_bins=n_mels, encoder_layers=1, decoder_layers=2, d_model=32,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_source_positions=1500, max_target_positions=48, **IDS)
    return WhisperForConditionalGeneration(cfg).eval()


def fake_log_mel(audio: torch.Tensor, n_mels: int = 8) -> torch.Tensor:
    """Any [n_mels, frames] at 100 frames/s (160 samples of 16 kHz audio per frame) will do for the engine."""
    return audio[: len(audio) // 160 * 160].view(-1, 160)[:, :n_mels].T.contiguous()


def tiny_whisper_recipe(**overrides: Any) -> WhisperRecipe:
    """A WhisperRecipe over ``hf_whisper()`` with ``fake_log_mel``: prompt [2], stop {3}, tokens as numbers, on the
    CPU in float32, capped at 4 tokens per second of audio (random weights never say end-of-text); ``overrides``
    replace any of those (``text``, ``tokens_per_s``, ``max_tokens``, ...)."""
    from lingua_fusion.serving.gpu.models import HFWhisperDecoder
    from lingua_fusion.serving.gpu.recipes import WhisperRecipe, hf_whisper_encoder

    model = hf_whisper()
    options: dict[str, Any] = {"mel": fake_log_mel, "prompt": lambda _p: [2], "text": lambda t: " ".join(map(str, t)),
                               "stop": frozenset({3}), "device": "cpu", "dtype": torch.float32, "tokens_per_s": 4.0,
                               "encode": hf_whisper_encoder(model)}
    return WhisperRecipe(HFWhisperDecoder(model), **{**options, **overrides})


def hf_marian(seed: int = 0) -> torch.nn.Module:
    """A tiny Hugging Face Marian (OPUS-MT's architecture, random weights)."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    cfg = MarianConfig(vocab_size=97, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=48,
                       scale_embedding=True, **IDS)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()  # zero by default: make the test see whether it is added
    return model


@torch.inference_mode()
def hf_greedy(model: torch.nn.Module, memory: torch.Tensor, prompt: list[int], max_new: int,
              stop: frozenset[int]) -> list[int]:
    """Hugging Face's own forward pass, the whole sequence every step: the reference for its layouts."""
    tokens, out = list(prompt), []
    while len(out) < max_new and len(tokens) < 48:
        logits = model(encoder_outputs=(memory[None],), decoder_input_ids=torch.tensor([tokens]),
                       use_cache=False).logits
        tok = int(logits[0, -1].argmax())
        if tok in stop:
            break
        out.append(tok)
        tokens.append(tok)
    return out
