"""Architectures behind the DecodeEngine's ``DecoderModel``: Whisper's decoder (OpenAI whisper's module layout, as
models/whisper_torch.py builds it from the shipped weights), Hugging Face's Whisper, and the MT decoders of
Hugging Face's Marian (OPUS-MT) and M2M100 (NLLB-200 has that architecture).

The models are torch modules of Hugging Face's or whisper's layout, read by attribute: their sub-modules' calls are
untyped (Any), so each result is named as the Tensor it is before it is returned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .decoder_model import Attend


class WhisperDecoder:
    """``DecoderModel`` over a Whisper module's ``.decoder`` (pre-norm blocks: ``attn_ln``/``attn``,
    ``cross_attn_ln``/``cross_attn``, ``mlp_ln``/``mlp``; logits tied to the token embedding)."""

    def __init__(self, model: Any, *, suppress: Sequence[int] = (), suppress_first: Sequence[int] = ()) -> None:
        dec = model.decoder
        self.dec = dec
        d_model = dec.token_embedding.embedding_dim
        self.n_layer = len(dec.blocks)
        self.n_head = int(model.dims.n_text_head)
        self.head_dim = d_model // self.n_head
        self.max_positions = int(dec.positional_embedding.shape[0])
        weight = dec.token_embedding.weight
        self._mask = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
        self._mask[list(suppress)] = float("-inf")
        self._first = torch.zeros_like(self._mask)
        self._first[list(suppress_first)] = -1e9  # added only where ``first``: a finite value keeps 0 * it at 0

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.n_head, self.head_dim)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        embedded: torch.Tensor = self.dec.token_embedding(tokens) + self.dec.positional_embedding[positions]
        return embedded

    def layer(self, i: int, x: torch.Tensor, self_attn: Attend, cross_attn: Attend) -> torch.Tensor:
        blk = self.dec.blocks[i]
        h = blk.attn_ln(x)
        a = self_attn(self._heads(blk.attn.query(h)), self._heads(blk.attn.key(h)), self._heads(blk.attn.value(h)))
        x = x + blk.attn.out(a.reshape(x.shape[0], -1))
        h = blk.cross_attn_ln(x)
        x = x + blk.cross_attn.out(cross_attn(self._heads(blk.cross_attn.query(h))).reshape(x.shape[0], -1))
        out: torch.Tensor = x + blk.mlp(blk.mlp_ln(x))
        return out

    def logits(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = (self.dec.ln(x) @ self.dec.token_embedding.weight.T).float() + self._mask
        return out + first[:, None].float() * self._first

    def cross_kv(self, i: int, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.dec.blocks[i].cross_attn
        return self._heads(attn.key(memory)), self._heads(attn.value(memory))


class _HFAttention:
    """Projections of a Hugging Face attention module (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``)."""

    def __init__(self, attn: Any, n_head: int) -> None:
        self.a, self.n_head = attn, n_head

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.n_head, -1)

    def qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.heads(self.a.q_proj(h)), self.heads(self.a.k_proj(h)), self.heads(self.a.v_proj(h))

    def kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.a.k_proj(memory)), self.heads(self.a.v_proj(memory))

    def out(self, a: torch.Tensor) -> torch.Tensor:
        projected: torch.Tensor = self.a.out_proj(a.reshape(a.shape[0], -1))
        return projected


class _HFDecoder:
    """What Hugging Face's encoder-decoders share: ``model.model.decoder.layers`` with ``self_attn`` and
    ``encoder_attn``, sizes in ``model.config``."""

    def __init__(self, model: Any, max_positions: int, *, suppress: Sequence[int] = (),
                 suppress_first: Sequence[int] = ()) -> None:
        self.dec = model.model.decoder
        cfg = model.config
        self.n_layer = cfg.decoder_layers
        self.n_head = cfg.decoder_attention_heads
        self.head_dim = cfg.d_model // self.n_head
        self.max_positions = max_positions
        self._attn = [(_HFAttention(lyr.self_attn, self.n_head), _HFAttention(lyr.encoder_attn, self.n_head))
                      for lyr in self.dec.layers]
        weight = model.get_output_embeddings().weight
        self._mask = torch.zeros(weight.shape[0], device=weight.device)  # tokens the model never outputs
        self._mask[list(suppress)] = float("-inf")
        self._first = torch.zeros_like(self._mask)  # ... and never as its first output
        self._first[list(suppress_first)] = -1e9  # added only where ``first``: a finite value keeps 0 * it at 0

    def _suppressed(self, logits: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return logits.float() + self._mask + first[:, None].float() * self._first

    def cross_kv(self, i: int, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._attn[i][1].kv(memory)


class _PreNormDecoder(_HFDecoder):
    """Layers that normalise before each sub-layer (Whisper, M2M100 / NLLB; Marian normalises after)."""

    def layer(self, i: int, x: torch.Tensor, self_attn: Attend, cross_attn: Attend) -> torch.Tensor:
        lyr = self.dec.layers[i]
        sa, ca = self._attn[i]
        x = x + sa.out(self_attn(*sa.qkv(lyr.self_attn_layer_norm(x))))
        x = x + ca.out(cross_attn(ca.heads(ca.a.q_proj(lyr.encoder_attn_layer_norm(x)))))
        out: torch.Tensor = x + lyr.fc2(lyr.activation_fn(lyr.fc1(lyr.final_layer_norm(x))))
        return out


class HFWhisperDecoder(_PreNormDecoder):
    """``DecoderModel`` over Hugging Face's ``WhisperForConditionalGeneration`` (pre-norm layers, logits from
    ``proj_out``): the layout of the random-weight models the GPU benchmark builds from a ``WhisperConfig``."""

    def __init__(self, model: Any, *, suppress: Sequence[int] = (), suppress_first: Sequence[int] = ()) -> None:
        super().__init__(model, model.config.max_target_positions, suppress=suppress, suppress_first=suppress_first)
        self.proj = model.proj_out

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        embedded: torch.Tensor = self.dec.embed_tokens(tokens) + self.dec.embed_positions.weight[positions]
        return embedded

    def logits(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return self._suppressed(self.proj(self.dec.layer_norm(x)), first)


class MarianDecoder(_HFDecoder):
    """``DecoderModel`` over Hugging Face's ``MarianMTModel`` (OPUS-MT; post-norm layers, scaled embeddings,
    sinusoidal positions from 0, ``final_logits_bias``)."""

    def __init__(self, model: Any, *, suppress: Sequence[int] = (), suppress_first: Sequence[int] = ()) -> None:
        super().__init__(model, model.config.max_position_embeddings, suppress=suppress,
                         suppress_first=suppress_first)
        self.head = model.lm_head
        self.bias = model.final_logits_bias
        self.scale = float(getattr(self.dec, "embed_scale", 1.0))

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        positional = self.dec.embed_positions.weight[positions]
        embedded: torch.Tensor = self.dec.embed_tokens(tokens) * self.scale + positional
        return embedded

    def layer(self, i: int, x: torch.Tensor, self_attn: Attend, cross_attn: Attend) -> torch.Tensor:
        lyr = self.dec.layers[i]
        sa, ca = self._attn[i]
        x = lyr.self_attn_layer_norm(x + sa.out(self_attn(*sa.qkv(x))))
        x = lyr.encoder_attn_layer_norm(x + ca.out(cross_attn(ca.heads(ca.a.q_proj(x)))))
        out: torch.Tensor = lyr.final_layer_norm(x + lyr.fc2(lyr.activation_fn(lyr.fc1(x))))
        return out

    def logits(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return self._suppressed(self.head(x) + self.bias, first)


class M2M100Decoder(_PreNormDecoder):
    """``DecoderModel`` over Hugging Face's ``M2M100ForConditionalGeneration`` (M2M100 and NLLB-200: pre-norm
    layers, a final layer norm, embeddings scaled inside ``embed_tokens``, sinusoidal positions that start at
    ``pad_token_id`` + 1, logits from ``lm_head`` without a bias)."""

    def __init__(self, model: Any, *, suppress: Sequence[int] = (), suppress_first: Sequence[int] = ()) -> None:
        dec = model.model.decoder
        self.offset = int(dec.embed_positions.padding_idx) + 1  # a decoder input never holds the pad token
        super().__init__(model, int(dec.embed_positions.weights.shape[0]) - self.offset, suppress=suppress,
                         suppress_first=suppress_first)
        self.head = model.lm_head

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        table = self.dec.embed_positions.weights
        embedded: torch.Tensor = self.dec.embed_tokens(tokens) + table[positions + self.offset].to(table.dtype)
        return embedded

    def logits(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return self._suppressed(self.head(self.dec.layer_norm(x)), first)
