"""A continuous runner (serving/threads.py ContinuousRunner) for any encoder-decoder: its own thread runs the
encoder on batches of new work and steps the DecodeEngine, so new items join the running batch at the next step.
It alternates: one encoder batch (``encode_batch`` items at most) of what waits, then one step, so a burst of new
work is encoded between the steps of what already runs instead of holding them all up.

What a model needs is its ``Recipe`` (serving/gpu/recipes.py): how to encode a batch of payloads, the prompt and
length of each, and how to read the tokens back. Encoder outputs are kept per payload key (the same audio window
read again by a commit after its partials) while the cross-attention pool has room.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypedDict, TypeVar, cast

import torch

from ...errors import BackendError, CapacityExhausted
from .decoder import DecodeEngine
from .decoder_model import Decoded, DecoderModel
from .graphs import buckets_up_to, own_stream
from .memo import EncoderMemo
from .memory import MemoryReport, PoolMemory, RunnerLoad, budget_bytes, pool_blocks
from .paged import PagedKV

T = TypeVar("T")

log = logging.getLogger("lingua_fusion.gpu")
PREPARE_TIMEOUT_S = 900.0  # a runner's graph captures (hundreds on CUDA) must be done by then
MAX_BATCH = 1024  # rows a decode step takes at most (the largest CUDA graph bucket)
PUBLISH_S = 0.25  # the memory report is refreshed at most this often (and when the runner goes idle)


class Recipe(Protocol):
    @property
    def decoder(self) -> DecoderModel: ...  # read-only here: a recipe may hold a narrower DecoderModel

    @property
    def stop(self) -> frozenset[int]: ...

    def encode(self, payloads: list[Any]) -> list[torch.Tensor]:
        """Each payload's encoder output [frames, d_model], computed in as few batched calls as it likes."""
        ...

    def prompt(self, payload: Any) -> list[int]: ...

    def max_new(self, payload: Any) -> int: ...

    def key(self, payload: Any) -> bytes | None:
        """Payloads with the same key share one encoder output (None: never shared)."""
        ...

    def result(self, payload: Any, decoded: Decoded) -> Any: ...


class CpuPools(TypedDict):
    """A runner's fixed pool sizes where it does not size them from the GPU's free memory (the CPU)."""

    blocks: int
    cross_blocks: int


class GpuRunner:
    def __init__(self, recipe: Recipe, *, blocks: int, cross_blocks: int, block_size: int = 16,
                 cross_block_size: int = 64, max_batch: int = MAX_BATCH, max_pending: int = 8192,
                 encode_batch: int = 128, memo: int = 2048, dtype: torch.dtype = torch.float16,
                 device: str | torch.device = "cuda", name: str = "gpu", kernel: str = "auto",
                 graphs: bool = False, prefix_cache: bool = True, prepare: Sequence[Callable[[], None]] = (),
                 gather_s: float = 0.0, gather_items: int = 8, overlap: bool = False) -> None:
        """``prepare``: calls made on the runner's own thread before it takes any work (and before this returns),
        such as capturing the recipe's encoder graphs (``EncoderGraphs.capture_ahead``); ``graphs``: the decode
        step's CUDA graphs, captured there too. A graph is captured on the thread that replays it: with that
        thread's cuBLAS handle, never one another runner's graphs replay with at the same time. ``gather_s``: while
        sequences are decoding, new items wait up to this long for ``gather_items`` to start together (an encoder
        batch costs the thread about as much for one item as for several; 0: each turn starts what has come).
        ``overlap`` (CUDA): a turn that starts new items launches its step first and starts them while the step
        runs, then takes the step's tokens; off, it starts them, then steps and waits."""
        self.recipe = recipe
        self.engine = DecodeEngine(recipe.decoder, blocks=blocks, block_size=block_size, cross_blocks=cross_blocks,
                                   cross_block_size=cross_block_size, max_batch=max_batch, dtype=dtype,
                                   device=device, kernel=kernel, prefix_cache=prefix_cache)
        steps: list[Callable[[], None]] = list(prepare)
        if graphs:
            steps.append(functools.partial(self._step_graphs, name, max_batch))
        self.max_pending = max_pending
        self.encode_batch = encode_batch
        self.memo = EncoderMemo(recipe, memo)  # payload key -> cross entry (holds one reference): serving/gpu/memo.py
        self._inbox: deque[tuple[Any, bool, Future[Any]]] = deque()
        self._arrived: deque[float] = deque()  # when each inbox item came (perf_counter), for ``gather_s``
        self.gather_s, self.gather_items = gather_s, gather_items
        self.overlap = overlap and self.engine.device.type == "cuda"
        # items whose encoder output found the cross-attention pool full while sequences were running: started
        # again (first, in order) once one of those has finished and freed its entry (``_freed``); on the runner's
        # thread only. They stay pending, so ``room`` holds the executor's work back meanwhile
        self._parked: deque[tuple[Any, bool, Future[Any]]] = deque()
        self._freed = 0  # sequences finished (each may have freed an entry) since the parked items were last tried
        self._cv = threading.Condition()
        self._live: set[Future[Any]] = set()  # submitted, not yet settled: each leaves once (``_done``)
        self._closed = False
        self.encoded = self.reused = 0
        self.load = RunnerLoad()
        # told the load with each memory report (a copy, on this runner's thread): /metrics (observability.GpuLoad)
        self.on_load: Callable[[RunnerLoad], None] | None = None
        self._labels = (f"gpu.{name}.start", f"gpu.{name}.step")  # ranges a torch.profiler trace shows
        d = recipe.decoder
        self._token_bytes = PagedKV.bytes_per_token(d.n_layer, d.n_head, d.head_dim, dtype)
        self.memory: MemoryReport | None = None  # published by the runner's thread (serving/gpu/memory.py)
        self._published = 0.0
        self._publish()
        self._profile: tuple[tuple[int, float], ...] = ()  # the step's seconds per batch size (``step_profile``)
        self._prepared = threading.Event()
        self._prepare_error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, args=(steps,), name=f"gpu-{name}", daemon=True)
        self._thread.start()
        if not self._prepared.wait(timeout=PREPARE_TIMEOUT_S):
            self.close()
            raise BackendError(f"the GPU runner {name} was not ready after {PREPARE_TIMEOUT_S:.0f} s")
        if self._prepare_error is not None:  # (its traceback holds the thread's frame, which holds this runner)
            error, self._prepare_error = self._prepare_error, None
            raise error

    @classmethod
    def sized(cls, recipe: Recipe, *, fraction: float, device: str = "cuda", block_size: int = 16,
              cross_block_size: int = 64, cross_share: float = 0.5, dtype: torch.dtype = torch.float16,
              share: float = 1.0, **kwargs: Any) -> GpuRunner:
        """A runner whose pools take ``fraction`` of the GPU memory free now (after the weights are loaded), at most
        ``share`` of that fraction of the total (``models.gpu_memory_fraction``, ``models.gpu_memory_share``),
        ``cross_share`` of it for encoder outputs."""
        d = recipe.decoder
        token_bytes = PagedKV.bytes_per_token(d.n_layer, d.n_head, d.head_dim, dtype)
        most = int(kwargs.get("max_batch", MAX_BATCH)) * -(-d.max_positions // block_size) + 1  # + the scratch one
        blocks, cross = pool_blocks(budget_bytes(device, fraction, share), token_bytes, token_bytes,
                                    block_size=block_size, cross_block_size=cross_block_size, cross_share=cross_share,
                                    max_self_blocks=most)
        log.info("GPU pools: %d self blocks of %d tokens, %d cross blocks of %d frames (%.1f GiB)", blocks,
                 block_size, cross, cross_block_size,
                 (blocks * block_size + cross * cross_block_size) * token_bytes / 2**30)
        return cls(recipe, blocks=blocks, cross_blocks=cross, block_size=block_size,
                   cross_block_size=cross_block_size, dtype=dtype, device=device, **kwargs)

    def _step_graphs(self, name: str, max_batch: int) -> None:
        """The decode step replayed from CUDA graphs (serving/gpu/graphs.py), captured on the runner's thread; where
        they cannot be (no Triton attention, a driver or build that refuses a capture) the runner steps eagerly,
        one launch per operator, and says so once."""
        cuda = self.engine.device.type == "cuda"
        stream = torch.cuda.current_stream(self.engine.device) if cuda else None  # the runner's own (``_loop``)
        try:
            self.engine.use_graphs(buckets_up_to(max_batch))
            self._time_graphs(name)
            return
        except ValueError as exc:  # the engine's own refusal (no Triton attention): nothing was captured
            self.engine.graphs = None
            log.warning("%s: no CUDA graphs of the decode step (%s); it steps eagerly", name, exc)
            return
        except RuntimeError as exc:
            failure = f"{type(exc).__name__}: {exc}"
        self.engine.graphs = None  # what was captured before the failure goes with them (the traceback too)
        gc.collect()
        if stream is not None:
            torch.cuda.set_stream(stream)  # a capture that failed inside may have left its own stream current
            torch.cuda.synchronize(self.engine.device)  # a fault of the device itself raises here: the build fails
            torch.cuda.empty_cache()
        log.warning("%s: CUDA graphs of the decode step failed (%s); it steps eagerly", name, failure)

    def _time_graphs(self, name: str) -> None:
        """Time the captured step graphs (admission's shape of this runner); a failure leaves it without one (the
        graphs serve on: admission then extrapolates by its measured slope)."""
        assert self.engine.graphs is not None
        try:
            self._profile = self.engine.graphs.profile()
        except RuntimeError as exc:
            log.warning("%s: the decode step's graphs could not be timed (%s); admission goes by its slope", name,
                        exc)
            return
        log.info("%s: decode step ms by batch size: %s", name,
                 ", ".join(f"{b}: {s * 1e3:.2f}" for b, s in self._profile))

    def _publish(self, every_s: float = 0.0) -> None:
        """A fresh MemoryReport (on the runner's thread, which owns the pools), at most every ``every_s``."""
        now = time.monotonic()
        if now - self._published < every_s:
            return
        self._published = now
        e = self.engine
        self.memory = MemoryReport({"self": PoolMemory.of(e.pool.stats(), self._token_bytes),
                                    "cross": PoolMemory.of(e.cross_pool.stats(), self._token_bytes)},
                                   encoder_cache_entries=len(self.memo))
        if self.on_load is not None:
            try:  # /metrics' counters: never the runner's thread's end
                self.on_load(dataclasses.replace(self.load))
            except Exception:  # noqa: BLE001 - logged; the runner goes on serving
                log.exception("GPU runner %s: its load could not be counted", self._labels[1])

    # ---- ContinuousRunner ---------------------------------------------------------------------------------
    def room(self) -> int:
        with self._cv:
            return self.max_pending - len(self._live)

    def busy_s(self) -> float:
        """Seconds its thread has spent starting work and stepping (serving/threads.py BusyCounted: admission's
        pace of it); read from another thread, a float at a time."""
        return self.load.start_s + self.load.step_s

    def step_profile(self) -> tuple[tuple[int, float], ...]:
        """(batch size, seconds) of a decode step replayed from its CUDA graph, timed once they were captured
        (serving/threads.py StepProfiled: admission's shape of this runner); none where it steps eagerly."""
        return self._profile

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        futures: list[Future[Any]] = [Future() for _ in payloads]
        with self._cv:
            if self._closed:
                raise BackendError("the GPU runner is closed")
            self._inbox.extend(zip(payloads, tentative, futures, strict=True))
            self._arrived.extend([time.perf_counter()] * len(payloads))
            self._live.update(futures)
            self._cv.notify()
        return futures

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # ---- the runner's thread ------------------------------------------------------------------------------
    def _loop(self, prepare: list[Callable[[], None]]) -> None:
        try:
            if self.engine.device.type == "cuda":  # this runner's own CUDA stream: another runner's encoder batch
                torch.cuda.synchronize(self.engine.device)  # or the VAD's copy never waits behind its steps (the
                torch.cuda.set_stream(own_stream(self.engine.device))  # pools made on the default one first)
            for step in prepare:
                step()
            prepare.clear()  # what the steps hold (graph builders) is not kept for the runner's life
        except BaseException as exc:  # the constructor raises it; this thread serves nothing
            self._prepare_error = exc
            self._closed = True
            return
        finally:
            self._prepared.set()
        while True:
            with self._cv:
                while not self._inbox and not self._parked and self.engine.idle() and not self._closed:
                    self._publish()  # idle: what is left held (the encoder cache) is reported as it is
                    self._cv.wait(timeout=0.5)
                if self._closed:
                    break
                # one encoder batch at most, then a step: running decodes never wait behind a long queue of starts
                new = self._next_starts()
            launched, overlap = None, bool(new) and self.overlap and not self.engine.idle()
            try:
                if overlap:
                    launched = self._timed_step(self.engine.launch)  # (None: every sequence parked)
                if new:
                    self._timed_start(new)
                if launched is not None:
                    self._timed_step(functools.partial(self.engine.finish, launched), count=True)
                elif not overlap and not self.engine.idle():
                    self._timed_step(self.engine.step, count=True)
            except Exception as exc:  # a CUDA error, out of memory: fail what is in flight, keep serving
                log.exception("GPU runner step failed")
                if launched is not None and launched.done is not None:  # its copies done before the next step's
                    with contextlib.suppress(Exception):
                        launched.done.synchronize()
                self._fail_all(new, BackendError(f"the GPU engine failed: {type(exc).__name__}: {exc}"))
                self._parked = deque(p for p in self._parked if not p[2].done())  # those failed just now
            self._publish(PUBLISH_S)
        with self._cv:
            left = [*self._parked, *self._inbox]
            self._inbox.clear()
            self._arrived.clear()
        self._parked.clear()
        self._fail_all(left, BackendError("the GPU runner closed"))

    def _next_starts(self) -> list[tuple[Any, bool, Future[Any]]]:
        """The next encoder batch (under the lock). Parked items come first, once a finished sequence may have
        freed a cross-attention entry or nothing runs (then none will be freed, and what still does not fit fails);
        new items wait while any are parked, so items start in the order they came."""
        if self._parked:
            if not (self._freed or self.engine.idle()):
                return []
            n = min(len(self._parked), self.encode_batch, max(1, self._freed))  # about as many as may fit now
            self._freed = 0
            return [self._parked.popleft() for _ in range(n)]
        if self.gather_s > 0 and len(self._inbox) < min(self.gather_items, self.encode_batch) \
                and not self.engine.idle() and self._arrived and \
                time.perf_counter() - self._arrived[0] < self.gather_s:
            return []  # a step first: more may come to share this encoder batch
        n = min(len(self._inbox), self.encode_batch)
        for _ in range(n):
            self._arrived.popleft()
        return [self._inbox.popleft() for _ in range(n)]

    def _timed_start(self, new: list[tuple[Any, bool, Future[Any]]]) -> None:
        t = time.perf_counter()
        try:  # busy time counts whether it raised or not (admission's pace: serving/service_curve.py BusyPace)
            with torch.profiler.record_function(self._labels[0]):
                self._start(new)
        finally:
            self.load.start_s += time.perf_counter() - t
        self.load.starts += 1
        self.load.started_items += len(new)

    def _timed_step(self, part: Callable[[], T], count: bool = False) -> T:
        """A step, or either half of one (``count``: the half that ends it, returning its rows)."""
        t = time.perf_counter()
        try:
            with torch.profiler.record_function(self._labels[1]):
                out = part()
        finally:
            self.load.step_s += time.perf_counter() - t
        if count:
            self.load.steps += 1
            self.load.step_rows += cast(int, out)
        return out

    def _done(self, fut: Future[Any], value: Any = None, exc: BaseException | None = None) -> None:
        with self._cv:
            self._live.discard(fut)  # once, however many paths settle it (a failed step, then its sequence)
        if fut.done():  # settled before, or cancelled by its caller
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def _start(self, items: list[tuple[Any, bool, Future[Any]]]) -> None:
        """One encoder batch: ``items`` are at most ``encode_batch`` (the loop takes no more per turn)."""
        waiting = items
        items = []
        for it in waiting:
            if it[2].done():  # cancelled by its caller while it waited (a timed-out MT call): nothing to run
                self._done(it[2])
            else:
                items.append(it)
        if not items:
            return
        keys, filters = self.memo.keys([p for p, _, _ in items], [t for _, t, _ in items])
        fresh = [i for i, k in enumerate(keys) if self.memo.get(k) is None]
        memories: dict[int, torch.Tensor] = {}
        if fresh:
            t = time.perf_counter()
            memories = dict(zip(fresh, self.recipe.encode([items[i][0] for i in fresh]), strict=True))
            self.load.encode_s += time.perf_counter() - t
        self.encoded += len(fresh)
        added = dict(zip(memories, self._add([memories[i] for i in memories], [keys[i] for i in memories],
                                             [filters[i] for i in memories]), strict=True))
        full: list[tuple[Any, bool, Future[Any]]] = []
        # fresh entries whose reference is still the caller's: released below once their sequence holds its own, or
        # in ``finally`` if an item raises first (a prompt, a submit): else no one would (a commit has no key)
        owed = {i: c for i, c in added.items() if c is not None and self.memo.get(keys[i]) != c}
        try:
            self._submit_started(items, keys, memories, added, full, owed)
        finally:
            for cid in owed.values():
                self.engine.release(cid)
        while len(self.memo) > self.memo.size:
            self.engine.release(self.memo.forget_oldest())
        if self.engine.idle():  # nothing running holds an entry: nothing will make room for these
            for _, _, fut in full:
                self._done(fut, exc=CapacityExhausted("the GPU cross-attention pool is full"))
        elif full:  # encoded again when they start (a parked output would hold memory the pool is short of)
            self._parked.extendleft(reversed(full))
            self._freed = 0  # what finished before they were parked freed nothing they can use

    def _submit_started(self, items: list[tuple[Any, bool, Future[Any]]], keys: list[bytes | None],
                        memories: dict[int, torch.Tensor], added: dict[int, int | None],
                        full: list[tuple[Any, bool, Future[Any]]], owed: dict[int, int]) -> None:
        """Each encoded (or memo-found) item's sequence into the engine; ``full`` gets the committed ones the
        cross-attention pool had no room for; an entry of ``owed`` is released (and dropped) once its sequence
        holds its own reference."""
        for i, (payload, tentative, fut) in enumerate(items):
            key = keys[i]
            cid = added[i] if i in added else self.memo.get(key)
            if cid is None:
                if tentative or (i in memories and not self.engine.fits_ever(memories[i].shape[0])):
                    # a partial is not held back (a newer one replaces it; the executor sheds late ones), and a
                    # window larger than the whole pool never fits
                    self._done(fut, exc=CapacityExhausted("the GPU cross-attention pool is full"))
                else:
                    full.append((payload, tentative, fut))
                continue
            if i not in added and key is not None:  # its memory came from the memo (so it has a key)
                self.memo.use(key)
                self.reused += 1
            inner = self.engine.submit(self.recipe.prompt(payload), cid, max_new=self.recipe.max_new(payload),
                                       stop=self.recipe.stop, tentative=tentative)
            if owed.pop(i, None) is not None:
                self.engine.release(cid)  # the sequence holds its own reference; the memo holds none to this one
            inner.add_done_callback(functools.partial(self._finished, payload, fut))

    def _add(self, memories: list[torch.Tensor], keys: list[bytes | None], filters: list[bytes | None]
             ) -> list[int | None]:
        cids = self.engine.add_memories(memories)
        while any(c is None for c in cids) and self.memo:  # make room: forget the least recently used outputs
            for _ in range(min(len(self.memo), 64)):
                self.engine.release(self.memo.forget_oldest())
            missing = [i for i, c in enumerate(cids) if c is None]
            for i, c in zip(missing, self.engine.add_memories([memories[i] for i in missing]), strict=True):
                cids[i] = c
        for cid, key, near in zip(cids, keys, filters, strict=True):
            if cid is not None and key is not None:
                self.memo.keep(key, cid, near)  # the same window twice in one batch: one entry
        return cids

    def _finished(self, payload: Any, fut: Future[Any], decoded: Future[Decoded]) -> None:
        self._freed += 1  # its cross-attention entry is released (unless the memo holds it): a parked one may fit
        try:
            self._done(fut, self.recipe.result(payload, decoded.result()))
        except Exception as exc:
            self._done(fut, exc=BackendError(f"decoding failed: {exc}"))

    def _fail_all(self, new: list[tuple[Any, bool, Future[Any]]], exc: BackendError) -> None:
        for _, _, fut in new:
            if not fut.done():
                self._done(fut, exc=exc)
        self.engine.fail_all(exc)
