"""The block pool of a paged KV cache: pure bookkeeping, no tensors.

The cache is one pool of fixed-size blocks (``block_size`` token slots each). A sequence owns a block table (the
list of its blocks, in order); token ``i`` of the sequence lives in slot ``table[i // block_size] * block_size +
i % block_size``. Blocks are taken from a free list as a sequence grows and all go back when it finishes or is
preempted. Running out is a return value (``False`` / ``None``), not an exception: the caller preempts (the
lowest-priority tentative work first) and tries again.

Prefix reuse: a FULL block can be published under a key (the caller's: for the decoder, its cross-attention entry
and the exact prompt tokens up to the block's end). Another sequence whose prompt starts the same way continues
its table with those blocks (``cached`` finds them, ``extend`` takes them); blocks are refcounted, so a
shared block goes back only when its last user frees it. Only full blocks are ever shared and a sequence writes
only past its own length, so no block is written while shared (no copy-on-write). A published block nobody uses
stays in the cache, counted free: it is handed out again (least recently used first, after the plain free blocks)
only when the pool has nothing else, or dropped at once with its group (``drop_group``: the cross entry died).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolStats:
    blocks: int
    used: int  # blocks some sequence holds (a shared block counts once)
    tokens: int  # token slots holding a token (a shared block's slots count once)
    sequences: int
    block_size: int
    cached: int = 0  # free blocks that still hold a published prefix (reusable until handed out again)
    shared: int = 0  # used blocks held by more than one sequence

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
        self._refs: dict[int, int] = {}  # block -> sequences holding it (blocks in use only)
        self._extra = 0  # sum over used blocks of (refs - 1): slots counted more than once in the lengths
        self._key: dict[int, tuple[Hashable, Hashable]] = {}  # published block -> (group, key)
        self._by_key: dict[Hashable, int] = {}
        self._groups: dict[Hashable, set[int]] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # published blocks nobody holds, oldest first

    # ---- queries --------------------------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_allocate(self, tokens: int) -> bool:
        return self.blocks_for(tokens) <= len(self._free) + len(self._idle)

    def table(self, seq: int) -> list[int]:
        return self._tables[seq]

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def slot(self, seq: int, position: int) -> int:
        table = self._tables[seq]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def __contains__(self, seq: int) -> bool:
        return seq in self._tables

    def refs(self, block: int) -> int:
        return self._refs.get(block, 0)

    def cached(self, keys: Iterable[Hashable]) -> list[int]:
        """The published blocks of the longest run of ``keys`` (a chain: block ``i`` under the ``i``-th key; read
        lazily, up to the first miss)."""
        out: list[int] = []
        for key in keys:
            block = self._by_key.get(key)
            if block is None:
                break
            out.append(block)
        return out

    def stats(self) -> PoolStats:
        idle = len(self._idle)
        used = self.num_blocks - self.reserved - len(self._free) - idle
        tokens = sum(self._lengths.values()) - self._extra * self.block_size
        shared = sum(1 for r in self._refs.values() if r > 1)
        return PoolStats(self.num_blocks - self.reserved, used, tokens, len(self._tables), self.block_size, idle,
                         shared)

    # ---- changes --------------------------------------------------------------------------------------------
    def allocate(self, seq: int, tokens: int) -> bool:
        """Room for a new sequence's first ``tokens`` tokens. False (nothing taken) when the pool is short."""
        if seq in self._tables:
            raise ValueError(f"sequence {seq} already has blocks")
        need = self.blocks_for(tokens)
        if need > len(self._free) + len(self._idle):
            return False
        table = []
        for _ in range(need):
            block = self._take()
            assert block is not None  # counted above
            table.append(block)
        self._tables[seq] = table
        self._lengths[seq] = tokens
        return True

    def extend(self, seq: int, blocks: list[int]) -> None:
        """``seq``, whose tokens fill its table exactly, takes the published (full, written) ``blocks`` as its
        next ones: their tokens are its next tokens. Never short of room: nothing new is taken."""
        n, table = self._lengths[seq], self._tables[seq]
        if n != len(table) * self.block_size or any(b not in self._key or b in table for b in blocks):
            raise ValueError("only published blocks extend a sequence whose last block is full")
        for b in blocks:
            self._hold(b)
        table.extend(blocks)
        self._lengths[seq] = n + len(blocks) * self.block_size

    def append(self, seq: int) -> int | None:
        """Room for one more token of ``seq``: its slot, or None when a new block is needed and none is free."""
        n = self._lengths[seq]
        table = self._tables[seq]
        if n == len(table) * self.block_size:
            block = self._take()
            if block is None:
                return None
            table.append(block)
        self._lengths[seq] = n + 1
        return table[n // self.block_size] * self.block_size + n % self.block_size

    def publish(self, seq: int, index: int, group: Hashable, key: Hashable) -> bool:
        """Offer block ``index`` of ``seq`` (full) for reuse under ``key`` (in ``group``). False when the key is
        taken already (another sequence published the same prefix first) or the block is published."""
        if (index + 1) * self.block_size > self._lengths[seq]:
            raise ValueError("only full blocks are shared")
        block = self._tables[seq][index]
        if key in self._by_key or block in self._key:
            return False
        self._key[block] = (group, key)
        self._by_key[key] = block
        self._groups.setdefault(group, set()).add(block)
        return True

    def free(self, seq: int) -> None:
        """Give back every block of ``seq`` (finished or preempted). Unknown sequences are ignored. A block other
        sequences hold stays; a published one nobody holds stays cached (the tail of a chain goes first)."""
        table = self._tables.pop(seq, None)
        self._lengths.pop(seq, None)
        for block in reversed(table or ()):
            refs = self._refs[block] - 1
            if refs:
                self._refs[block] = refs
                self._extra -= 1
                continue
            del self._refs[block]
            if block in self._key:
                self._idle[block] = None
            else:
                self._free.append(block)

    def drop_group(self, group: Hashable) -> None:
        """Unpublish every block of ``group``: cached ones go back to the free list at once."""
        for block in self._groups.pop(group, ()):
            del self._by_key[self._key.pop(block)[1]]
            if block in self._idle:
                del self._idle[block]
                self._free.append(block)

    def _hold(self, block: int) -> None:
        if block in self._refs:
            self._refs[block] += 1
            self._extra += 1
        else:
            del self._idle[block]
            self._refs[block] = 1

    def _take(self) -> int | None:
        """A block for a new owner: a plain free one, else the least recently used cached prefix block."""
        if self._free:
            block = self._free.pop()
        elif self._idle:
            block, _ = self._idle.popitem(last=False)
            group, key = self._key.pop(block)
            del self._by_key[key]
            members = self._groups[group]
            members.discard(block)
            if not members:
                del self._groups[group]
        else:
            return None
        self._refs[block] = 1
        return block
