"""Paged KV storage and attention over it (plain PyTorch: the reference path every faster kernel is tested against).

One ``PagedKV`` holds the keys and values of every layer in flat slot arrays ``[layers, slots, heads, head_dim]``;
which slots belong to which sequence is the BlockPool's business (serving/gpu/blocks.py). Attention gathers each
sequence's slots through an index tensor built from its block table, masks the padding, and runs SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import triton_attention
from .blocks import BlockPool


@dataclass
class Gather:
    """Which slots each row of a batch reads: its block table (``tables`` [batch, blocks]) and length
    (``lengths`` [batch]), on the device; the reference path's ``index`` [batch, max_len] (padding points at slot
    0) and ``mask`` [batch, 1, 1, max_len] are built from them when first asked for."""

    tables: torch.Tensor
    lengths: torch.Tensor
    block_size: int
    max_len: int
    _index: torch.Tensor | None = None
    _mask: torch.Tensor | None = None

    @classmethod
    def build(cls, pool: BlockPool, seqs: list[int], lengths: list[int], device: torch.device) -> Gather:
        n_blocks = -(-max(lengths) // pool.block_size)
        tables = np.zeros((len(seqs), n_blocks), dtype=np.int64)
        for row, seq in enumerate(seqs):
            t = pool.table(seq)[:n_blocks]
            tables[row, : len(t)] = t
        return cls.from_tables(tables, np.asarray(lengths, dtype=np.int64), pool.block_size, device)

    @classmethod
    def from_tables(cls, tables: np.ndarray, lengths: np.ndarray, block_size: int, device: torch.device) -> Gather:
        """``tables`` [batch, blocks] (each row's block ids, in order) and ``lengths`` [batch] (tokens per row)."""
        max_len = int(lengths.max())
        n_blocks = -(-max_len // block_size)
        tables_t = torch.from_numpy(np.ascontiguousarray(tables[:, :n_blocks])).to(device, non_blocking=True)
        lens = torch.from_numpy(np.ascontiguousarray(lengths)).to(device, non_blocking=True)
        return cls(tables_t, lens, block_size, max_len)

    @property
    def index(self) -> torch.Tensor:
        if self._index is None:
            dev, bs = self.tables.device, self.block_size
            index = (self.tables[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(len(self.tables), -1)
            index = index[:, : self.max_len]
            valid = torch.arange(self.max_len, device=dev)[None, :] < self.lengths[:, None]
            self._index, self._mask = index * valid, valid[:, None, None, :]
        return self._index

    @property
    def mask(self) -> torch.Tensor:
        if self._mask is None:
            _ = self.index
        assert self._mask is not None
        return self._mask


def slots_of(pool: BlockPool, seq: int, start: int, stop: int) -> np.ndarray:
    """The slots of positions ``start``..``stop``-1 of ``seq`` (vectorised: a window's frames at once)."""
    bs = pool.block_size
    table = np.asarray(pool.table(seq), dtype=np.int64)
    return (table[:, None] * bs + np.arange(bs)).reshape(-1)[start:stop]


class PagedKV:
    def __init__(self, pool: BlockPool, layers: int, heads: int, head_dim: int, *, dtype: torch.dtype,
                 device: torch.device | str, kernel: str = "auto") -> None:
        slots = pool.num_blocks * pool.block_size
        self.pool = pool
        dev = torch.device(device)
        if kernel == "auto":
            kernel = "triton" if triton_attention.available(dev) else "torch"
        self.kernel = kernel  # "torch": the reference path (gather, then SDPA); "triton": in place
        self.heads, self.head_dim = heads, head_dim
        self.k = torch.zeros(layers, slots, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(layers, slots, heads, head_dim, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(layers: int, heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the keys/values ``[n, heads, head_dim]`` of ``n`` tokens in their ``slots`` ``[n]``."""
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def attend(self, layer: int, q: torch.Tensor, gather: Gather) -> torch.Tensor:
        """``q`` [batch, heads, n_q, head_dim] attends over each row's gathered slots -> same shape as ``q``."""
        if self.kernel == "triton" and q.shape[2] == 1:
            out = triton_attention.paged_decode(q[:, :, 0], self.k[layer], self.v[layer], gather.tables,
                                                gather.lengths, gather.block_size)
            return out[:, :, None, :]
        k = self.k[layer][gather.index].transpose(1, 2)  # [batch, heads, max_len, head_dim]
        v = self.v[layer][gather.index].transpose(1, 2)
        return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=gather.mask)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The reference: ``k``/``v`` [batch, heads, max_len, head_dim] padded per row to ``lengths``."""
    max_len = k.shape[2]
    mask = torch.arange(max_len, device=q.device)[None, :] < torch.tensor(lengths, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])


@dataclass
class DeviceInputs:
    """One decode step's inputs on the device (StepInputs.to_device, or a CUDA graph's static buffers: graphs.py)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    self_gather: Gather
    cross_gather: Gather
    first: torch.Tensor


@dataclass
class StepInputs:
    """One step's inputs on the host, a row per running sequence."""

    tokens: np.ndarray
    positions: np.ndarray
    slots: np.ndarray  # where each row's new key/value goes
    self_tables: np.ndarray  # [rows, blocks]
    self_lens: np.ndarray
    cross_tables: np.ndarray
    cross_lens: np.ndarray
    first: np.ndarray  # 1 where this step gives the row's first output token

    def to_device(self, device: torch.device, block: int, cross_block: int) -> DeviceInputs:
        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)

        return DeviceInputs(t(self.tokens), t(self.positions), t(self.slots),
                            Gather.from_tables(self.self_tables, self.self_lens, block, device),
                            Gather.from_tables(self.cross_tables, self.cross_lens, cross_block, device),
                            t(self.first))
