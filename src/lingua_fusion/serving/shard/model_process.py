"""The model process: ONE executor (scheduler, per-key workers, VAD lane, retries, admission) for the streams of
every worker process it serves, over a Unix socket (codec.py). A server runs one (``serve --workers N``), or
several (``--model-processes M``: each with its own engine and its share of the GPU memory, each feeding the workers
``i % M == its index``, for when one process's Python is the limit before the GPU is).

Each worker connects once; its requests run concurrently here, so work from every worker's streams meets in the
same scheduler queues and batches (cross-worker batching, the SLO scheduler's fairness between API keys). What
lives here and nowhere else:
- the models (and on a GPU machine the GPU engine: the executor's ``backends``, serving/gpu),
- admission: the admitted streams of its workers and their estimated load (``Executor.admit``), ``max_streams``,
  and the per-key stream count (``server.max_streams_per_key`` across all workers; with several model processes
  the count and the total are in the shared ledger.py, so they hold across all of them),
- which worker owns which admitted stream: when a worker's connection ends, its streams are released.
A worker re-registers its live streams after this process restarts (``admit`` with ``force``), so admission
stays right across a model-process restart.

Traces (on when ``otel.endpoint`` is set: the same settings as the workers'): a ``run`` from a traced stream carries
the worker's client span as a W3C ``traceparent``; this process's own tracer records the item's batch span under it
(``Executor`` -> ``record_batch``) and exports it itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ...config import Settings
from ...errors import BackendError, LinguaFusionError, Overloaded
from ...models.registry import Registry
from ...tracing import Tracer, TraceRef, from_settings
from ..executor import Executor
from ..gpu.server import engine_backends, warm_engine
from ..keys import ModelKey
from ..ports import CallContext
from ..scheduler import Demand
from . import codec, shm
from .ledger import KeyCounts, Ledger
from .remote import link_in_flight

if TYPE_CHECKING:
    from ...observability import Metrics

log = logging.getLogger("lingua_fusion.serving.shard")
MAX_IN_FLIGHT = 4096  # requests one worker connection may have running here, at least (or the link's bound)
MODES = ("batched", "per-stream")
CLOSE_S = 5.0  # for the connections' handlers to return once their sockets are closed
DRAIN_GRACE_S = 15.0  # past the workers' drain deadline (api/workers.py kills a worker then)



class Settable(Protocol):
    """What ``serve`` is told it is ready with (a threading or multiprocessing Event)."""

    def set(self) -> None: ...

class ModelServer:
    """The executors ("batched", and "per-stream" for admin benchmark streams) behind one socket."""

    def __init__(self, settings: Settings, registry: Registry, metrics: Metrics | None = None,
                 tracer: Tracer | None = None, ledger: Ledger | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.tracer = tracer  # None: tracing off (a traceparent sent anyway is ignored)
        # streams per key (and in all): here, or across model processes (``--model-processes``: ledger.py)
        self.keys: Ledger = ledger if ledger is not None else KeyCounts(settings.server.max_streams_per_key)
        self.engines: dict[str, Executor] = {}
        self.owners: dict[tuple[str, str], tuple[int, str]] = {}  # (mode, stream) -> (connection, key id)
        # a connection's running requests: as many as a worker's link lets through, so committed work a worker sent
        # within its own bound is never refused here (Overloaded is not retried by RemotePort: its final would fail)
        self.max_in_flight = max(MAX_IN_FLIGHT, link_in_flight(settings))
        self._conns = 0
        self._live: dict[int, asyncio.StreamWriter] = {}  # the workers connected now
        self._none_live = asyncio.Event()
        self._none_live.set()
        # models.engine_warm's runners by model: "ready", "building", "failed: why" (serve() sets it)
        self.engine_state: Callable[[], dict[str, str]] = dict

    def engine(self, mode: str) -> Executor:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if mode not in self.engines:
            backends = engine_backends(self.registry, self.settings, self.metrics) if mode == "batched" else {}
            self.engines[mode] = Executor(self.registry, self.settings,
                                          self.metrics if mode == "batched" else None, mode=mode,
                                          backends=backends)
        return self.engines[mode]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's connection: requests in, replies out, until it ends; then its streams are released."""
        self._conns += 1
        conn = self._conns
        self._live[conn] = writer
        self._none_live.clear()
        out = codec.Outbox(writer)  # the replies of one turn of the loop leave in one frame
        tasks: set[asyncio.Task[None]] = set()
        view: shm.View | None = None  # the worker's ring, mapped at its handshake (shm.py)
        try:
            while True:
                try:
                    msgs = await codec.read_frames(reader, view)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                for msg in msgs:
                    if msg.get("op") == "ping" and "ring" in msg and view is None:  # a worker's handshake
                        view = shm.View.open(msg["ring"], shm.peer_pid(writer.get_extra_info("socket")))
                        out.put({"op": "ok", "id": msg.get("id"), "value": os.getpid(), "ring": view is not None})
                        continue
                    # admission is answered here, in the order it came: a release sent right behind its admit
                    # (in the same frame, or the next one already read) frees what that admit reserved
                    if msg.get("op") == "release":
                        self._release(str(msg["mode"]), str(msg["stream_id"]), conn)
                        continue
                    if msg.get("op") in ("admit", "ping", "engine"):
                        self._answer(conn, out, msg)
                        continue
                    if len(tasks) >= self.max_in_flight:
                        self._reply(out, msg, error=Overloaded("the model process is full", retry_after=1.0))
                        continue
                    task = asyncio.create_task(self._serve(conn, out, msg))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except ValueError as exc:  # a frame that is not ours: drop the connection, not the process
            log.error("bad frame from a worker: %s", exc)
        finally:
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for (mode, sid), (c, _key) in list(self.owners.items()):
                if c == conn:
                    self._release(mode, sid)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            del self._live[conn]
            if not self._live:
                self._none_live.set()
            if view is not None:
                view.close()

    async def drain(self, timeout_s: float) -> int:
        """Serve the workers still connected until they hang up (they are draining their own streams, which may
        need this process's models), ``timeout_s`` at most; then end the connections left, so every handler
        returns on its own. Returns how many were still connected at the timeout."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_live.wait(), timeout_s)
        left = len(self._live)
        for writer in list(self._live.values()):
            writer.close()  # the handler reads end-of-file and returns, releasing that worker's streams
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_live.wait(), CLOSE_S)
        return left

    async def _serve(self, conn: int, out: codec.Outbox, msg: codec.Message) -> None:
        op = msg.get("op")
        try:
            if op != "run":
                raise ValueError(f"unknown op {op!r}")
            key = ModelKey.parse(str(msg["key"]))
            fields = msg["ctx"]
            if not isinstance(fields, dict):
                raise TypeError(f"a call context must be a map, not a {type(fields).__name__}")
            ctx = CallContext(**fields, trace=self._parent(msg))
            engine = self.engine(str(msg["mode"]))
            value = await engine.run(key, msg["payload"], ctx)
            self._reply(out, msg, value=value, depth=engine.depth(key))
        except LinguaFusionError as exc:
            self._reply(out, msg, error=exc)
        except (ValueError, TypeError, KeyError) as exc:
            self._reply(out, msg, error=LinguaFusionError(f"bad model request: {exc}"))

    def _answer(self, conn: int, out: codec.Outbox, msg: codec.Message) -> None:
        """``admit``, ``ping`` and ``engine``: answered at once, in the connection's order (no awaiting in them)."""
        try:
            if msg.get("op") == "admit":
                demand = msg["demand"]
                if not isinstance(demand, Demand):
                    raise TypeError(f"admit needs a Demand, not a {type(demand).__name__}")
                self._admit(conn, str(msg["mode"]), demand, str(msg["key_id"]), bool(msg.get("force")))
                self._reply(out, msg)
            elif msg.get("op") == "engine":  # the warm runners' states (a worker's /readyz)
                self._reply(out, msg, value=self.engine_state())
            else:
                self._reply(out, msg, value=os.getpid())
        except LinguaFusionError as exc:
            self._reply(out, msg, error=exc)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._reply(out, msg, error=LinguaFusionError(f"bad model request: {exc}"))
        except Exception as exc:  # answered, typed: the read loop (and the worker's other streams) go on
            log.exception("admission failed")
            self._reply(out, msg, error=BackendError(f"admission failed: {type(exc).__name__}: {exc}"))

    def _parent(self, msg: codec.Message) -> TraceRef | None:
        """The worker's client span of this call (tracing on, and a traceparent sent), parent of its batch span."""
        if self.tracer is None:
            return None
        traceparent = msg.get("traceparent")
        return self.tracer.remote(traceparent) if isinstance(traceparent, str) else None

    def _admit(self, conn: int, mode: str, demand: Demand[ModelKey], key_id: str, force: bool) -> None:
        engine = self.engine(mode)
        ident = (mode, demand.stream_id)
        if ident in self.owners:  # admitted twice (a resume racing its old session): one reservation
            self._release(mode, demand.stream_id)
        engine.prepare(demand)
        try:
            self.keys.take(ident, key_id, force)
        except Overloaded:  # the key's cap, or the ledger's total: counted as admission counts its own refusals
            if self.metrics is not None:
                self.metrics.streams_rejected.inc()
            raise
        try:
            if force:  # re-registered after this process restarted: it was admitted before
                engine.readmit(demand)
            else:
                engine.admit(demand)
        except BaseException:
            self.keys.give(ident, key_id)
            raise
        self.owners[ident] = (conn, key_id)

    def _release(self, mode: str, stream_id: str, conn: int | None = None) -> None:
        """``conn``: released by that connection's worker, so only if it owns the stream (a stream resumed on
        another worker since is that worker's; the old session ending later frees nothing of it)."""
        owner = self.owners.get((mode, stream_id))
        if owner is None or (conn is not None and owner[0] != conn):
            return
        del self.owners[(mode, stream_id)]
        self.keys.give((mode, stream_id), owner[1])
        self.engine(mode).release(stream_id)

    @staticmethod
    def _reply(out: codec.Outbox, msg: codec.Message, *, value: object = None, depth: int = 0,
               error: LinguaFusionError | None = None) -> None:
        if out.writer.is_closing():
            return
        if error is not None:
            reply: codec.Message = {"op": "err", "id": msg.get("id"), "error": codec.error_to_wire(error)}
        else:
            reply = {"op": "ok", "id": msg.get("id"), "value": value, "depth": depth}
        try:
            out.put(reply)
        except (TypeError, ValueError) as exc:
            out.put({"op": "err", "id": msg.get("id"), "error": codec.error_to_wire(exc)})

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.close()


async def serve(path: str, settings: Settings, metrics: Metrics | None = None, *, ready: Settable | None = None,
                ledger: Ledger | None = None) -> None:
    """Serve on the Unix socket ``path`` until SIGTERM / SIGINT. ``ready`` (an Event) is set once it listens.
    ``ledger``: the admitted streams shared with the other model processes (several: ledger.py)."""
    tracer = from_settings(settings)
    server = ModelServer(settings, Registry(settings), metrics, tracer=tracer, ledger=ledger)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = await asyncio.start_unix_server(server.handle, path=path, limit=codec.MAX_FRAME)
    os.chmod(path, 0o600)  # only this user's processes (the workers) may connect
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)  # from the supervisor, once the workers have drained
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the workers drain first
    log.info("model process %d serving on %s", os.getpid(), path)
    warming = asyncio.create_task(asyncio.to_thread(_warm, server.registry, not settings.models.vad_in_workers),
                                  name="warm")
    server.engine_state = warm_engine(server.engine("batched"), settings) or dict  # built on threads of their own
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        # the supervisor sends SIGTERM once its workers have drained; a signal to the whole process group
        # (systemd's default KillMode, `kill -TERM -- -PGID`) reaches this process while they still drain: it serves
        # them until they hang up
        left = await server.drain(settings.server.drain_timeout_s + DRAIN_GRACE_S)
        if left:
            log.warning("model process ending with %d worker(s) still connected", left)
    finally:
        listener.close()
        await server.close()
        if tracer is not None:  # the spans still queued, sent (bounded by the exporter's timeout)
            await asyncio.to_thread(tracer.shutdown)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(warming, timeout=60)


def _warm(registry: Registry, vad: bool) -> None:
    """The default stream models loaded before the first stream asks (what the server's own warm-up loads); the
    VAD only where the streams' VAD runs here (not ``models.vad_in_workers``: each worker loads its own at its first
    stream's first audio)."""
    try:
        registry.asr("en")
        if vad:
            registry.vad()
        registry.warm_apertium("en", "es")
    except LinguaFusionError as exc:
        log.error("model warm-up failed: %s", exc.message)
