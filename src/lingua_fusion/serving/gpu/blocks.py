"""The block pool of a paged KV cache: pure bookkeeping, no tensors.

The cache is one pool of fixed-size blocks (``block_size`` token slots each). A sequence owns a block table (the
list of its blocks, in order); token ``i`` of the sequence lives in slot ``table[i // block_size] * block_size +
i % block_size``. Blocks are taken from a free list as a sequence grows and all go back when it finishes or is
preempted. Running out is a return value (``False`` / ``None``), not an exception: the caller preempts (the
lowest-priority tentative work first) and tries again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolStats:
    blocks: int
    used: int
    tokens: int  # token slots holding a token
    sequences: int
    block_size: int

    @property
    def free(self) -> int:
        return self.blocks - self.used

    @property
    def fragmentation(self) -> float:
        """Internal fragmentation: the share of allocated slots that hold no token (the tails of last blocks)."""
        slots = self.used * self.block_size
        return 0.0 if slots == 0 else 1.0 - self.tokens / slots


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, *, reserved: int = 0) -> None:
        """``reserved``: the first blocks are never handed out (scratch for padding rows)."""
        if num_blocks <= reserved or block_size < 1:
            raise ValueError("a pool needs at least one block of at least one slot")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserved = reserved
        self._free: list[int] = list(range(num_blocks - 1, reserved - 1, -1))  # pop() hands out low ids first
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}

    # ---- queries --------------------------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_allocate(self, tokens: int) -> bool:
        return self.blocks_for(tokens) <= len(self._free)

    def table(self, seq: int) -> list[int]:
        return self._tables[seq]

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def slot(self, seq: int, position: int) -> int:
        table = self._tables[seq]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def __contains__(self, seq: int) -> bool:
        return seq in self._tables

    def stats(self) -> PoolStats:
        used = self.num_blocks - self.reserved - len(self._free)
        return PoolStats(self.num_blocks - self.reserved, used, sum(self._lengths.values()), len(self._tables),
                         self.block_size)

    # ---- changes --------------------------------------------------------------------------------------------
    def allocate(self, seq: int, tokens: int) -> bool:
        """Room for a new sequence's first ``tokens`` tokens. False (nothing taken) when the pool is short."""
        if seq in self._tables:
            raise ValueError(f"sequence {seq} already has blocks")
        need = self.blocks_for(tokens)
        if need > len(self._free):
            return False
        self._tables[seq] = [self._free.pop() for _ in range(need)]
        self._lengths[seq] = tokens
        return True

    def append(self, seq: int) -> int | None:
        """Room for one more token of ``seq``: its slot, or None when a new block is needed and none is free."""
        n = self._lengths[seq]
        table = self._tables[seq]
        if n == len(table) * self.block_size:
            if not self._free:
                return None
            table.append(self._free.pop())
        self._lengths[seq] = n + 1
        return table[n // self.block_size] * self.block_size + n % self.block_size

    def free(self, seq: int) -> None:
        """Give back every block of ``seq`` (finished or preempted). Unknown sequences are ignored."""
        table = self._tables.pop(seq, None)
        self._lengths.pop(seq, None)
        if table:
            self._free.extend(reversed(table))
