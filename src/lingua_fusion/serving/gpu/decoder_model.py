"""What the decode engine (serving/gpu/decoder.py) asks of a decoder architecture, ``DecoderModel`` (adapters in
serving/gpu/models.py), and what it gives back per sequence, ``Decoded``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

Attend = Callable[..., torch.Tensor]


class DecoderModel(Protocol):
    n_layer: int
    n_head: int
    head_dim: int
    max_positions: int

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[batch] token ids at [batch] positions -> [batch, d_model]."""
        ...

    def layer(self, i: int, x: torch.Tensor, self_attn: Attend, cross_attn: Attend) -> torch.Tensor:
        """Layer ``i`` on [batch, d_model]; ``self_attn(q, k, v)`` and ``cross_attn(q)`` take and give
        [batch, heads, head_dim]."""
        ...

    def logits(self, x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """[batch, vocab] (with the model's suppressions; ``first`` [batch] marks each sequence's first output)."""
        ...

    def cross_kv(self, i: int, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s cross-attention keys and values of an encoder output [frames, d_model]: [frames, heads,
        head_dim] each."""
        ...


@dataclass
class Decoded:
    tokens: list[int]
    logprobs: list[float]
    preempted: int  # times this sequence was preempted and recomputed
