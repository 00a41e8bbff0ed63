"""The ModelPort of a stream worker process: model work and admission sent to the model process (model_process.py).

``ModelLink`` is the worker's one connection: it (re)connects with backoff, numbers requests, resolves each
request's future from its reply, and when the connection ends fails every request in flight at once with
``ModelProcessLost`` (a ``BackendError``, ``backend_unavailable``), then connects again and re-registers the
worker's admitted streams. ``RemotePort`` is one engine's view of it ("batched", or the admin-only "per-stream"
baseline), with the face the StreamService uses (``run``, ``depth``, ``demand``, ``reserve``, ``release``,
``close``):
- ``run``: VAD runs here, on this worker's own engine (``vad``, ``models.vad_in_workers``): every audio message asks
  for it, and a round trip per message cost the model process more than the model. A picture for OCR crosses at
  the size OCR reads it (pictures.py). Tentative work fails at once when
  the model process is lost (the contract: never retried); committed work is retried (``retries`` times) once the
  link is back, so a caption in flight when the model process dies is transcribed by its successor, or its final
  says ``failed``. Every call ends within ``server.request_timeout_s`` (``ModelTimeout``), like the in-process
  executor's.
- retries of backend failures inside the model process happen there (Executor.run), not twice.
- the stage latency of committed work (send -> reply, IPC included) goes to this worker's StageObserver, so each
  worker's SLO breaker hears its own streams.
- at most ``max_in_flight`` requests wait on the link; beyond that, and while the model process is down for
  longer than ``connect_wait_s``, a new stream is refused with ``Overloaded`` (429 / 4429); committed work waits
  up to ``RESTART_WAIT_S`` for the successor (each retry), tentative work fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ...config import Settings
from ...errors import BackendError, ModelTimeout, Overloaded
from ...models.registry import Registry
from ..demand import stream_demand
from ..engine import Engine
from ..faults import Fault
from ..keys import ModelKey
from ..ports import FILE_CLASS, CallContext, StageObserver, TypedPort
from ..scheduler import Demand
from . import codec, pictures, shm

log = logging.getLogger("lingua_fusion.serving.shard")
BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
RESTART_WAIT_S = 30.0  # committed work waits this long for a model process's successor (a start takes seconds)


def link_in_flight(settings: Settings) -> int:
    """A worker's bound on requests in flight on its link: a stream has a few at a time (VAD, a partial, a commit,
    MT per target), so 8 per stream the server admits, at least 1,024. The model process lets a connection have as
    many (model_process.py), so what the link lets through is never refused there."""
    return max(1024, 8 * settings.server.max_streams)


class ModelProcessLost(BackendError):
    """The model process ended (or its socket broke) while this request was in flight."""


class ModelLink:
    def __init__(self, path: str, *, max_in_flight: int = 1024, connect_wait_s: float = 5.0,
                 ring: bool = True) -> None:
        self.path = path
        self.connect_wait_s = connect_wait_s
        self.max_in_flight = max_in_flight
        self.admitted: dict[tuple[str, str], tuple[Demand[ModelKey], str]] = {}  # (mode, stream) -> (demand, key id)
        self.losses = 0  # connections lost (a test and the logs read it)
        self.model_pid = 0  # the model process's, from the handshake
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[codec.Message]] = {}
        self._outbox: codec.Outbox | None = None  # this connection's: a turn of the loop's requests in one frame
        # large arrays cross through it once the model process has mapped it (shm.py; ``server.shm_ring``)
        self.ring = shm.new_ring() if ring else None
        # the ring spans of calls sent, in the order sent: a reply to a call, or to any later one, says the model
        # process has decoded (copied out) its frame, since it decodes a connection's frames in order; then they may
        # be written again. A call that gave up keeps its spans until then; a long one (a file's piece) frees its
        # own as soon as any later call is answered. All in ``ring``: a new ring starts with none held
        self._held: deque[tuple[int, list[int]]] = deque()
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # ---- requests ----------------------------------------------------------------------------------------------
    async def call(self, msg: codec.Message, timeout_s: float) -> codec.Message:
        """Send ``msg`` and wait for its reply (a dict with ``value`` and ``depth``); raises the typed error the
        model process answered, ``ModelProcessLost``, ``ModelTimeout``, ``Overloaded``, or ``BackendError`` for a
        payload the wire cannot carry."""
        await self.wait_up(min(timeout_s, self.connect_wait_s))
        if len(self._pending) >= self.max_in_flight:
            raise Overloaded("too many model requests in flight from this worker", retry_after=1.0)
        ident = next(self._ids)
        fut: asyncio.Future[codec.Message] = asyncio.get_running_loop().create_future()
        self._pending[ident] = fut
        try:
            try:
                spans = self._send({**msg, "id": ident})
                if spans:
                    self._held.append((ident, spans))
            except (TypeError, ValueError) as exc:  # a payload the wire cannot carry (over MAX_FRAME, a str that
                # is not Unicode): this request fails typed, as a backend failure; the link and its other requests go on
                raise BackendError(f"this request cannot cross to the model process: {exc}") from exc
            reply = await asyncio.wait_for(fut, timeout=timeout_s)
        except TimeoutError:
            raise ModelTimeout(f"the model process gave no answer in {timeout_s:.0f} s") from None
        finally:
            self._pending.pop(ident, None)
        if reply["op"] == "err":
            raise codec.error_of(reply["error"])
        return reply

    async def ping(self, timeout_s: float) -> int:
        """The model process's pid once it answers (admission's path: its event loop, no model work), or the
        error of ``call``: ``ModelProcessLost`` while it is down, ``ModelTimeout`` when it is wedged."""
        return codec.integer((await self.call({"op": "ping"}, timeout_s))["value"])

    def tell(self, msg: codec.Message) -> None:
        """A message with no reply (``release``); dropped while the link is down (the successor does not know the
        stream either: it is re-registered from ``admitted`` only if still there). Its arrays go inline: no reply
        would free their spans."""
        if self._up.is_set():
            self._send(msg, shared=False)

    async def wait_up(self, timeout_s: float) -> None:
        self.start()
        try:
            await asyncio.wait_for(self._up.wait(), timeout=max(0.01, timeout_s))
        except TimeoutError:
            raise ModelProcessLost("the model process is not reachable (restarting?)") from None

    def _send(self, msg: codec.Message, shared: bool = True) -> list[int]:
        """Queue ``msg``; the spans its large arrays took in ``ring``."""
        if self._outbox is None or self._outbox.writer.is_closing():
            raise ModelProcessLost("the model process connection is down")
        # TypeError / ValueError at the caller: a payload that cannot cross
        return self._outbox.put(msg, shared=shared)

    def _decoded(self, ident: int) -> None:
        """The model process answered ``ident``: every frame up to its was decoded, their spans may be reused."""
        ring = self.ring  # (spans are held only while there is one)
        while ring is not None and self._held and self._held[0][0] <= ident:
            for at in self._held.popleft()[1]:
                ring.release(at)

    # ---- the connection ----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._closed:
            raise ModelProcessLost("the model link is closed")
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._connect_loop(), name="model-link")

    async def _connect_loop(self) -> None:
        tries = 0
        while not self._closed:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path, limit=codec.MAX_FRAME)
            except OSError:
                await asyncio.sleep(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                tries += 1
                continue
            self._outbox = codec.Outbox(writer)
            served = False
            try:
                # a handshake first: a socket that accepts but does not answer (a wedged or dying process, a
                # connection left in a closed listener's backlog) is not a model process
                self._send({"op": "ping", "id": 0, **({"ring": self.ring.handle()} if self.ring else {})},
                           shared=False)
                hello = await asyncio.wait_for(codec.read_frame(reader), timeout=self.connect_wait_s)
                if hello.get("op") != "ok":
                    raise ModelProcessLost("the model process did not answer its handshake")
                if hello.get("ring") is True:  # it mapped our ring: large arrays go through it
                    self._outbox.ring = self.ring
                self.model_pid, served, tries = codec.integer(hello.get("value")), True, 0
                for (mode, _sid), (demand, key_id) in list(self.admitted.items()):  # a successor: tell it ours
                    self._send({"op": "admit", "id": 0, "mode": mode, "demand": demand, "key_id": key_id,
                                "force": True})
                self._up.set()
                await self._read(reader)
            except (ModelProcessLost, TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
                pass
            finally:
                self._up.clear()
                self._outbox = None
                writer.close()
                failed = self._fail_pending()
                self._new_ring()
            if served:
                self.losses += 1
                if not self._closed:
                    log.warning("the model process connection ended; %d requests failed, connecting again", failed)
            else:
                await asyncio.sleep(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                tries += 1

    def _new_ring(self) -> None:
        """A connection ended with spans still held: the model process may yet decode frames it had buffered, so
        the next connection gets a ring of its own (this one is unmapped here; the model process unmaps its own
        when it is done with that connection)."""
        held, self._held = self._held, deque()
        if self.ring is None or not held:
            return
        old, self.ring = self.ring, None if self._closed else shm.new_ring()
        old.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                msgs = await codec.read_frames(reader)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                return
            for msg in msgs:
                fut = self._pending.get(codec.integer(msg.get("id")))
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            if self._held:
                self._decoded(max(codec.integer(m.get("id")) for m in msgs))

    def _fail_pending(self) -> int:
        failed = 0
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ModelProcessLost("the model process ended while this work was in flight"))
                failed += 1
        return failed

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._fail_pending()
        if self.ring is not None:
            ring, self.ring, self._held = self.ring, None, deque()
            ring.close()


class RemotePort(TypedPort):
    """One engine of the model process ("batched" or "per-stream") as this worker's ModelPort and admission."""

    def __init__(self, link: ModelLink, registry: Registry, settings: Settings, *, mode: str = "batched",
                 clock: Callable[[], float] = time.monotonic, observer: StageObserver | None = None,
                 vad: Engine | None = None) -> None:
        self.link = link
        # routes (StreamService.open parses a start message), and the VAD where ``vad`` runs it: no other model here
        self.registry = registry
        self.vad = vad  # this worker's own engine for its streams' VAD (``models.vad_in_workers``), closed with it
        self.settings = settings
        self.mode = mode
        self.clock = clock
        self.observer = observer  # this worker's SLO breakers (stream/supervisor.py), given by its builder
        self.retries = 2
        self.faults: dict[str, Fault] = {}  # chaos runs on a single-process server (serve refuses --chaos here)
        self._depth: dict[ModelKey, int] = {}

    async def run_untyped(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        if key.task == "vad" and self.vad is not None:  # here: a hop per audio message costs more than the model
            return await self.vad.run(key, payload, ctx)
        # a picture at the size OCR reads it (pictures.py)
        if key.task == "ocr" and isinstance(payload, np.ndarray) and pictures.shrinks(self.settings, payload):
            small, scale = await pictures.as_read_off_loop(payload)
            return pictures.scaled(await self._run(key, small, ctx), scale)
        return await self._run(key, payload, ctx)

    async def _run(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        msg: codec.Message = {"op": "run", "key": str(key), "mode": self.mode, "payload": payload,
                              "ctx": _ctx_wire(ctx)}
        if ctx.trace is None:  # tracing off: nothing added to the message
            return await self._call(key, msg, ctx)
        # tracing on: a client span for the round trip (retries included); the model process records the batch's
        # span under it, from the W3C traceparent sent beside the context (lingua_fusion/tracing)
        with ctx.trace.client(key.stage, model_key=str(key), tentative=ctx.tentative) as span:
            msg["traceparent"] = span.traceparent()
            value = await self._call(key, msg, ctx)
            if value is None:
                span.set(shed=True)
            return value

    async def _call(self, key: ModelKey, msg: codec.Message, ctx: CallContext) -> object:
        wait_s = self.settings.server.request_timeout_s
        end = self.clock() + wait_s
        attempt = 0
        while True:
            t0 = self.clock()
            try:
                reply = await self.link.call(msg, timeout_s=max(0.01, end - t0))
            except ModelProcessLost:
                if ctx.tentative or attempt >= self.retries or self.clock() >= end:
                    raise
                attempt += 1  # committed: wait for the successor, then send it again
                with contextlib.suppress(ModelProcessLost):
                    await self.link.wait_up(min(RESTART_WAIT_S, end - self.clock()))
                continue
            self._depth[key] = codec.integer(reply.get("depth"))
            if self.observer is not None and not ctx.tentative and self.mode == "batched" \
                    and ctx.slo != FILE_CLASS and reply.get("value") is not None:
                self.observer.stage_done(ctx.slo, key.stage, self.clock() - t0, ctx.key_id)
            return reply.get("value")

    def depth(self, key: ModelKey) -> int:
        return self.vad.depth(key) if key.task == "vad" and self.vad is not None else self._depth.get(key, 0)

    def stuck(self) -> dict[str, int]:
        """This worker's VAD calls past their timeout; the other model threads are in the model process (its own
        log and metrics say)."""
        return self.vad.stuck() if self.vad is not None else {}

    # ---- admission (decided in the model process, across every worker) -------------------------------------
    def demand(self, stream_id: str, slo: str, source: str, targets: list[str], partials: bool, step_s: float,
               inputs: list[str], detect: Sequence[str] = (), diarize: bool = False) -> Demand[ModelKey]:
        return stream_demand(stream_id, slo, source, targets, partials, step_s, inputs, detect, diarize)

    async def reserve(self, demand: Demand[ModelKey], key_id: str = "") -> None:
        ident = (self.mode, demand.stream_id)
        msg = {"op": "admit", "mode": self.mode, "demand": demand, "key_id": key_id}
        try:
            await self.link.call(msg, timeout_s=self.link.connect_wait_s * 2)
        except ModelProcessLost:
            raise Overloaded("the model process is restarting; retry shortly", retry_after=2.0,
                             not_serving=True) from None
        except BaseException as exc:  # refused, unanswered or cancelled while asking: no reservation may stay behind
            with contextlib.suppress(ModelProcessLost):
                self.link.tell({"op": "release", "mode": self.mode, "stream_id": demand.stream_id})
            if isinstance(exc, ModelTimeout):  # a wedged model process: to the client a full server, not a 1011
                raise Overloaded("the model process is not answering; retry shortly", retry_after=2.0,
                                 not_serving=True) from None
            raise
        self.link.admitted[ident] = (demand, key_id)

    def release(self, stream_id: str) -> None:
        """A stream ended: its queued work resolves to None there and its reservation is freed."""
        self.link.admitted.pop((self.mode, stream_id), None)
        with contextlib.suppress(ModelProcessLost):
            self.link.tell({"op": "release", "mode": self.mode, "stream_id": stream_id})

    async def close(self) -> None:
        try:
            if self.vad is not None:
                await self.vad.close()
        finally:
            await self.link.close()


def _ctx_wire(ctx: CallContext) -> codec.Message:
    """The call context's plain fields (a tracing span stays in this process; its ``traceparent`` is sent)."""
    return {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx) if f.name != "trace"}
