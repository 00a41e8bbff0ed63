"""Continuous batching of an encoder-decoder's decoder over paged KV caches.

Every ``step`` feeds one token to every running sequence (a prompt token while it is being read, then the token
generated at the previous step), so sequences join and leave the running batch at any step and a prompt is read
in the same steps as other sequences' generation. Self-attention keys/values go to a paged pool (one block table
per sequence); the encoder's keys/values (cross-attention) go to a second pool, written once per audio window and
shared by every decode of that window (a partial re-decode and the commit of the same audio read the same
entry). When the self-attention pool is full the lowest-priority running sequence (tentative work first) is
preempted: its blocks go back and it starts again later (greedy decoding recomputes the same tokens).

Prefix reuse where exact: a decode of the same audio window with a prompt that starts the same way (a partial and
the commit of one window, with the same glossary / context prompt) takes the full blocks of that prompt prefix that
another decode of the window wrote and skips those prompt positions (at its start, and at each block boundary while
it follows a decode further on in the prompt; a decode that reaches a block another decode of its window is writing
sits out until that block is full, at most ``block_size`` - 1 steps, then takes it). The key is (cross-attention
entry, exact prompt tokens up to the block's end): past the first layer a position's keys/values depend on the
cross-attention to the audio, so the same prompt over different audio is NOT the same cache and is never shared.
Blocks are refcounted in the pool (serving/gpu/blocks.py); only full blocks are shared, so nothing is copied on
write; unused cached blocks are handed out again least recently used first, and dropped with their cross entry.

The architecture is behind ``DecoderModel`` (serving/gpu/models.py has Whisper's); the engine knows layers,
heads, and attention, nothing of a particular model.
"""

from __future__ import annotations

import itertools
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...errors import CapacityExhausted
from ...models.host_copy import Readback, queued_copy
from .blocks import BlockPool
from .decoder_model import Decoded, DecoderModel
from .device_call import wait
from .paged import DeviceInputs, PagedKV, StepInputs, slots_of

if TYPE_CHECKING:
    from .graphs import StepGraphs


@dataclass
class _Seq:
    id: int
    prompt: list[int]
    cross: int
    max_new: int
    stop: frozenset[int]
    tentative: bool
    importance: float
    future: Future[Decoded]
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    pos: int = 0  # tokens fed so far
    preempted: int = 0
    row: int = -1  # its row in the engine's block-table mirror while it runs
    cross_row: int = -1  # its cross-attention entry's row in the mirror, and the entry's frames (while it runs)
    cross_len: int = 0
    keys: list[tuple[int, tuple[int, ...]]] | None = None  # prefix-cache keys of its prompt's full blocks

    @property
    def rank(self) -> tuple[bool, float, int]:
        """Higher ranks keep their place: committed before tentative, then importance, then age."""
        return (not self.tentative, self.importance, -self.id)

    def next_input(self) -> int:
        return self.prompt[self.pos] if self.pos < len(self.prompt) else self.out[-1]


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    steps: int
    tokens: int  # tokens fed (prompt and generated)
    preemptions: int
    self_blocks_used: int
    self_blocks: int
    cross_blocks_used: int
    cross_blocks: int
    fragmentation: float
    prefix_tokens: int = 0  # prompt tokens not fed because their keys/values were reused
    prefix_hits: int = 0  # times a sequence took cached prefix blocks (at its start, or catching up)
    prefix_waits: int = 0  # steps a sequence sat out for a block another decode of its window was writing
    self_blocks_shared: int = 0  # blocks held by more than one running sequence now
    self_blocks_cached: int = 0  # free blocks still holding a reusable prefix


@dataclass
class Launched:
    """A step between ``DecodeEngine.launch`` and ``finish``: its rows, those parked beside it, its outputs (host
    tensors once ``done`` has passed; None off CUDA, where they are ready)."""

    batch: list[_Seq]
    waiting: list[_Seq]
    best: torch.Tensor
    best_lp: torch.Tensor
    done: torch.cuda.Event | None


class DecodeEngine:
    def __init__(self, model: DecoderModel, *, blocks: int, block_size: int = 16, cross_blocks: int,
                 cross_block_size: int = 64, max_batch: int = 256, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", max_memory: int = 1500, kernel: str = "auto",
                 prefix_cache: bool = True) -> None:
        self.model = model
        self.prefix_cache = prefix_cache
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.pool = BlockPool(blocks, block_size, reserved=1)  # block 0: scratch for a CUDA graph's padding rows
        self.kv = PagedKV(self.pool, model.n_layer, model.n_head, model.head_dim, dtype=dtype, device=device,
                          kernel=kernel)
        self.cross_pool = BlockPool(cross_blocks, cross_block_size, reserved=1)
        self.cross = PagedKV(self.cross_pool, model.n_layer, model.n_head, model.head_dim, dtype=dtype,
                             device=device, kernel=kernel)
        self._cross_refs: dict[int, int] = {}
        # numpy mirrors of the block tables, so a step builds its gather indices in one array operation:
        # a row per running sequence, and a row per cross-attention entry (``max_memory`` frames at most)
        self._table = np.zeros((max_batch, -(-model.max_positions // block_size) + 1), dtype=np.int64)
        self._free_rows = list(range(max_batch - 1, -1, -1))
        self._cross_table = np.zeros((cross_blocks, -(-max_memory // cross_block_size) + 1), dtype=np.int64)
        self._free_cross_rows = list(range(cross_blocks - 1, -1, -1))
        self._cross_row: dict[int, int] = {}
        self._cross_len: dict[int, int] = {}
        self._ids = itertools.count(1)
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.graphs: StepGraphs | None = None  # once use_graphs() was called
        self._readback = Readback()  # a step's outputs to the host (CUDA only)
        self.steps = self.tokens = self.preemptions = 0
        self.prefix_tokens = self.prefix_hits = self.prefix_waits = 0

    # ---- cross-attention entries ----------------------------------------------------------------------------
    def add_memory(self, memory: torch.Tensor) -> int | None:
        """Write an encoder output [frames, d_model] as a cross-attention entry; None when its pool is full."""
        return self.add_memories([memory])[0]

    def fits_ever(self, frames: int) -> bool:
        """Whether an encoder output of ``frames`` could be added with the cross-attention pool empty."""
        return frames < self._cross_table.shape[1] * self.cross_pool.block_size and \
            -(-frames // self.cross_pool.block_size) <= self.cross_pool.stats().blocks

    def add_memories(self, memories: list[torch.Tensor]) -> list[int | None]:
        """Several encoder outputs at once (one projection per layer for all of them); None where the pool is
        full."""
        ids: list[int | None] = []
        slots: list[np.ndarray] = []
        rows: list[torch.Tensor] = []
        for memory in memories:
            cid = next(self._ids)
            frames = memory.shape[0]
            if frames >= self._cross_table.shape[1] * self.cross_pool.block_size or not self._free_cross_rows \
                    or not self.cross_pool.allocate(cid, frames):
                ids.append(None)
                continue
            ids.append(cid)
            self._cross_refs[cid] = 1  # the caller's reference
            row = self._cross_row[cid] = self._free_cross_rows.pop()
            table = self.cross_pool.table(cid)
            self._cross_table[row, : len(table)] = table
            self._cross_len[cid] = frames
            slots.append(slots_of(self.cross_pool, cid, 0, memory.shape[0]))
            rows.append(memory)
        if rows:
            slot_t = queued_copy(torch.from_numpy(np.concatenate(slots)), self.device)  # the encoder may still run
            flat = torch.cat(rows)
            with torch.inference_mode():
                for i in range(self.model.n_layer):
                    k, v = self.model.cross_kv(i, flat)
                    self.cross.write(i, slot_t, k, v)
        return ids

    def retain(self, cid: int) -> None:
        self._cross_refs[cid] += 1

    def release(self, cid: int) -> None:
        self._cross_refs[cid] -= 1
        if self._cross_refs[cid] <= 0:
            del self._cross_refs[cid]
            self.pool.drop_group(cid)  # its prefixes can never be asked for again
            self.cross_pool.free(cid)
            self._free_cross_rows.append(self._cross_row.pop(cid))
            del self._cross_len[cid]

    # ---- sequences ------------------------------------------------------------------------------------------
    def submit(self, prompt: list[int], cross: int | None, *, max_new: int, stop: frozenset[int],
               tentative: bool = False, importance: float = 0.5) -> Future[Decoded]:
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        if cross is None or cross not in self._cross_refs:
            raise ValueError("submit needs a live cross-attention entry (add_memory returned None: its pool is full)")
        fut: Future[Decoded] = Future()
        self.retain(cross)
        seq = _Seq(next(self._ids), list(prompt), cross, max_new, stop, tentative, importance, fut)
        (self.waiting.appendleft if not tentative else self.waiting.append)(seq)
        return fut

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def stats(self) -> EngineStats:
        s, c = self.pool.stats(), self.cross_pool.stats()
        return EngineStats(len(self.running), len(self.waiting), self.steps, self.tokens, self.preemptions, s.used,
                           s.blocks, c.used, c.blocks, s.fragmentation, self.prefix_tokens, self.prefix_hits,
                           self.prefix_waits, s.shared, s.cached)

    def _admit(self) -> None:
        # keep one free block per running sequence in reserve, so admission does not cause immediate preemption
        while self.waiting and len(self.running) < self.max_batch:
            reserve = len(self.running) + 1
            if self.pool.stats().free <= reserve:
                break
            seq = self.waiting.popleft()
            if seq.future.cancelled():
                self.release(seq.cross)
                continue
            seq.cross_row, seq.cross_len = self._cross_row[seq.cross], self._cross_len[seq.cross]
            self.pool.allocate(seq.id, 0)
            seq.row = self._free_rows.pop()
            self.running.append(seq)

    def _keys(self, seq: _Seq) -> list[tuple[int, tuple[int, ...]]]:
        """The cache keys of ``seq``'s prompt blocks (block ``i``: its window and the prompt up to the block's end)."""
        if seq.keys is None:
            bs = self.pool.block_size
            seq.keys = [(seq.cross, tuple(seq.prompt[:end])) for end in range(bs, len(seq.prompt) + 1, bs)]
        return seq.keys

    def _share_prefixes(self) -> set[int]:
        """Every running sequence at a block boundary of its prompt takes the next blocks of it that another decode
        of its window has written (published) instead of feeding those tokens. Returns the sequences that sit this
        step out: the block they would feed next is being written by another decode of their window (at most
        ``block_size`` - 1 steps ahead, or starting it in this step), which they take once it is full."""
        bs = self.pool.block_size
        reading = [s for s in self.running if s.pos < len(s.prompt)]  # (the rest generate: nothing to share)
        writing = {self._keys(s)[s.pos // bs] for s in reading if s.pos % bs and s.pos // bs < len(self._keys(s))}
        parked: set[int] = set()
        for seq in reading:
            if seq.pos % bs or seq.pos + bs >= len(seq.prompt):  # its last prompt token is always fed (first output)
                continue
            keys = self._keys(seq)
            at = seq.pos // bs
            shared = self.pool.cached(keys[at: (len(seq.prompt) - 1) // bs])
            if shared:
                self.pool.extend(seq.id, shared)
                self._table[seq.row, at: at + len(shared)] = shared
                seq.pos += len(shared) * bs  # those prompt positions are read, not fed
                self.prefix_tokens += len(shared) * bs
                self.prefix_hits += 1
                at += len(shared)
            if seq.pos + bs < len(seq.prompt):
                if keys[at] in writing:
                    parked.add(seq.id)
                    self.prefix_waits += 1
                else:
                    writing.add(keys[at])  # it writes that block now: the same decode at the same point waits
        return parked

    def _publish(self, seq: _Seq) -> None:
        """``seq``, still within its prompt (the step calls it for those rows only), may have just filled a block
        with prompt tokens: offer it to later decodes of its window."""
        bs = self.pool.block_size
        if self.prefix_cache and seq.pos % bs == 0:
            self.pool.publish(seq.id, seq.pos // bs - 1, seq.cross, self._keys(seq)[seq.pos // bs - 1])

    def _preempt(self) -> None:
        """Give back the blocks of the lowest-ranked running sequence; it waits and starts again later."""
        victim = min(self.running, key=lambda s: s.rank)
        self.running.remove(victim)
        self._vacate(victim)
        victim.out, victim.logprobs, victim.pos = [], [], 0
        victim.preempted += 1
        self.preemptions += 1
        (self.waiting.appendleft if not victim.tentative else self.waiting.append)(victim)

    def _slots(self, parked: set[int]) -> list[int]:
        """One slot per running sequence (but the ``parked``) for the token it reads now, preempting while the pool
        is short."""
        slots: dict[int, int] = {}
        while self.running:
            short = False
            for seq in self.running:
                if seq.id in slots or seq.id in parked:
                    continue
                slot = self.pool.append(seq.id)
                if slot is None:
                    short = True
                    break
                slots[seq.id] = slot
                n = self.pool.length(seq.id) - 1
                if n % self.pool.block_size == 0:  # a new block: mirror it
                    self._table[seq.row, n // self.pool.block_size] = slot // self.pool.block_size
            if not short:
                break
            if len(self.running) == 1:  # alone and still short: it can never fit; fail it rather than spin
                seq = self.running.pop()
                tokens = self.pool.length(seq.id)
                self._end(seq, exc=CapacityExhausted(f"a sequence of {tokens + 1} tokens does not fit the KV pool"))
                break
            self._preempt()
            slots = {sid: slot for sid, slot in slots.items() if sid in self.pool}
        return [slots[s.id] for s in self.running if s.id not in parked]

    # ---- one step -------------------------------------------------------------------------------------------
    def step(self) -> int:
        """Feed one token to every running sequence; finish those that stop. Returns how many were running."""
        launched = self.launch()
        return self.finish(launched) if launched is not None else 0

    @torch.inference_mode()  # also when the runner calls it alone (step overlap): no autograd history, and the
    def launch(self) -> Launched | None:  # pinned read-back buffers, made in inference mode, written in it
        """A step's first half: its rows' next tokens queued on the device, their copy to the host after them
        (None: nothing to run). Until ``finish`` the host is free for other work on the runner's thread (an encoder
        batch queued behind the step); nothing may change ``running`` meanwhile but ``finish`` (or ``fail_all``)."""
        self._admit()
        if not self.running:
            return None
        parked = self._share_prefixes() if self.prefix_cache else set()
        slots = self._slots(parked)
        batch = [s for s in self.running if s.id not in parked] if parked else self.running
        waiting = [s for s in self.running if s.id in parked] if parked else []
        if not batch:
            return None
        n = len(batch)
        rows = np.fromiter((s.row for s in batch), dtype=np.int64, count=n)
        crows = np.fromiter((s.cross_row for s in batch), dtype=np.int64, count=n)
        inputs = StepInputs(
            tokens=np.fromiter((s.next_input() for s in batch), dtype=np.int64, count=n),
            positions=np.fromiter((s.pos for s in batch), dtype=np.int64, count=n),
            slots=np.asarray(slots, dtype=np.int64),
            self_tables=self._table[rows], self_lens=np.fromiter((s.pos + 1 for s in batch), dtype=np.int64, count=n),
            cross_tables=self._cross_table[crows],
            cross_lens=np.fromiter((s.cross_len for s in batch), dtype=np.int64, count=n),
            first=np.fromiter((s.pos + 1 == len(s.prompt) for s in batch), dtype=np.int64, count=n))
        try:
            if self.graphs is not None and self.graphs.fits(n):
                best, best_lp = self.graphs.run(inputs)
            else:
                best, best_lp = self.forward(inputs.to_device(self.device, self.pool.block_size,
                                                              self.cross_pool.block_size))
            done = None
            if self.device.type == "cuda":  # read back through pinned buffers, copied as the step ends: work queued
                best, best_lp = self._readback.copy(best, best_lp)  # after it (an encoder batch) is not waited for
                done = torch.cuda.Event(blocking=True)  # cudaEventBlockingSync: its synchronize sleeps
                done.record()
        except BaseException:  # the next step's inputs go into the same pinned buffer, which must not be rewritten
            if self.device.type == "cuda":  # while this step's copy from it may still be queued
                wait()
            raise
        return Launched(batch, waiting, best, best_lp, done)

    @torch.inference_mode()
    def finish(self, launched: Launched) -> int:
        """A launched step's second half: wait for its tokens (without Python's lock), then append or end."""
        if launched.done is not None:
            launched.done.synchronize()  # Python's lock is released for the wait (torch's binding)
        batch, n = launched.batch, len(launched.batch)
        best_l, best_lp_l = launched.best.tolist()[:n], launched.best_lp.tolist()[:n]
        self.steps += 1
        self.tokens += len(batch)
        keep: list[_Seq] = []
        max_positions = self.model.max_positions
        for seq, tok, lp in zip(batch, best_l, best_lp_l, strict=True):
            seq.pos += 1
            if seq.pos <= len(seq.prompt):  # a row past its prompt has nothing to offer
                self._publish(seq)
            if seq.pos >= len(seq.prompt):  # this step's output is a generated token
                if tok in seq.stop:
                    self._end(seq)
                    continue
                seq.out.append(tok)
                seq.logprobs.append(lp)
                if len(seq.out) >= seq.max_new or seq.pos + 1 >= max_positions:
                    self._end(seq)
                    continue
            keep.append(seq)
        self.running = keep + launched.waiting
        return len(batch)

    def forward(self, x: DeviceInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder step on the device: each row's next token and its log-probability (the same code runs
        eagerly and inside a CUDA graph: no host synchronisation, no data-dependent shapes)."""
        h = self.model.embed(x.tokens, x.positions)
        for i in range(self.model.n_layer):
            def self_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int = i) -> torch.Tensor:
                self.kv.write(i, x.slots, k, v)
                return self.kv.attend(i, q[:, :, None, :], x.self_gather)[:, :, 0, :]

            def cross_attn(q: torch.Tensor, i: int = i) -> torch.Tensor:
                return self.cross.attend(i, q[:, :, None, :], x.cross_gather)[:, :, 0, :]

            h = self.model.layer(i, h, self_attn, cross_attn)
        logp = torch.log_softmax(self.model.logits(h, x.first.bool()).float(), dim=-1)
        best_lp, best = logp.max(dim=-1)
        return best, best_lp

    def use_graphs(self, buckets: list[int]) -> None:
        """Replay the decode step from CUDA graphs captured per batch size in ``buckets`` (padded up to the next
        one): the step's hundreds of kernel launches cost one launch. Needs the Triton attention (static shapes)."""
        from .graphs import StepGraphs, StepShape

        if self.kv.kernel != "triton":
            raise ValueError(f"they need the Triton paged attention, not {self.kv.kernel!r}")
        shape = StepShape(self.device, self._table.shape[1], self._cross_table.shape[1], self.pool.block_size,
                          self.cross_pool.block_size)
        self.graphs = StepGraphs(self.forward, shape, sorted(b for b in buckets if b <= self.max_batch))
        self.graphs.capture_all()

    def _vacate(self, seq: _Seq) -> None:
        """A running sequence gives its blocks and its table row back."""
        self.pool.free(seq.id)
        self._free_rows.append(seq.row)
        seq.row = -1

    def _end(self, seq: _Seq, *, exc: BaseException | None = None) -> None:
        """The sequence is done (its tokens, or ``exc``): everything it holds goes back."""
        if seq.row >= 0:
            self._vacate(seq)
        self.release(seq.cross)
        if seq.future.done():
            return
        if exc is not None:
            seq.future.set_exception(exc)
        else:
            seq.future.set_result(Decoded(seq.out, seq.logprobs, seq.preempted))

    def fail_all(self, exc: BaseException) -> None:
        """Every sequence in the engine fails with ``exc`` and gives its blocks back (after a CUDA error)."""
        for seq in [*self.running, *self.waiting]:
            self._end(seq, exc=exc)
        self.running, self.waiting = [], deque()

    def run(self, max_steps: int = 100_000) -> None:
        """Step until nothing is left (tests, and the benchmark's warm-up)."""
        for _ in range(max_steps):
            if self.idle():
                return
            self.step()
        raise RuntimeError("the decode engine did not finish")
