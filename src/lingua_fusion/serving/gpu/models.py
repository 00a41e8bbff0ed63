"""Architectures behind the DecodeEngine's ``DecoderModel``: Whisper's decoder (OpenAI whisper's module layout, as
models/whisper_torch.py builds it from the shipped weights)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .decoder import Attend


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
        return self.dec.token_embedding(tokens) + self.dec.positional_embedding[positions]

    def layer(self, i: int, x: torch.Tensor, self_attn: Attend, cross_attn: Attend) -> torch.Tensor:
        blk = self.dec.blocks[i]
        h = blk.attn_ln(x)
        a = self_attn(self._heads(blk.attn.query(h)), self._heads(blk.attn.key(h)), self._heads(blk.attn.value(h)))
        x = x + blk.attn.out(a.reshape(x.shape[0], -1))
        h = blk.cross_attn_ln(x)
        x = x + blk.cross_attn.out(cross_attn(self._heads(blk.cross_attn.query(h))).reshape(x.shape[0], -1))
        return x + blk.mlp(blk.mlp_ln(x))

    def logits(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        out = (self.dec.ln(x) @ self.dec.token_embedding.weight.T).float() + self._mask
        return out + first[:, None].float() * self._first

    def cross_kv(self, i: int, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.dec.blocks[i].cross_attn
        return self._heads(attn.key(memory)), self._heads(attn.value(memory))
