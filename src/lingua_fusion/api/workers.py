"""``linguafusion serve --workers N [--model-processes M]``: N stream worker processes and M model processes (one by
default), supervised.

- The supervisor (this process) binds one listening socket per worker, all on the port with ``SO_REUSEPORT``
  (``server.reuse_port``), and hands worker ``i`` socket ``i``: the kernel spreads new connections over them by a
  hash of their addresses, so each worker gets about 1/N of the streams. One socket that every worker accepts on
  (uvicorn's ``--workers``; ``reuse_port`` false) gave the worker that woke first most of them: 58 of 200 streams
  on one of 12 workers, none on another (bench/accept_balance.py). A live stream stays on the worker that accepted
  its WebSocket. The supervisor keeps every socket open, so a dead worker's connections wait in its backlog for
  the worker started in its place. A port already in use is refused (a plain bind is tried first); that guards
  against a server already on the port, not one that binds it later with ``SO_REUSEPORT`` as the same user (the
  kernel lets that one join and share the connections).
- Each worker's event loop beats once a second into shared memory (``SharedBeat``, from uvicorn's ticks; infinity
  once it drains). One silent for ``server.worker_stall_s`` (wedged, or stopped alone) is killed and started
  again, so its share of new connections waits at most that long plus a restart. A gap in the supervisor's own
  looks (the whole group stopped, the machine asleep) restarts the count.
- Each worker runs the whole app (routes, auth, the StreamService: sessions, VAD bookkeeping, policies, journal,
  event encoding, WebSocket I/O, file requests) with its live streams' ModelPort pointing at the model process
  (serving/shard/remote.py).
- The model process (serving/shard/model_process.py) holds the models, the one executor and scheduler that
  batches every worker's streams, and admission (stream load and per-key stream counts across workers). With
  ``--model-processes M`` worker ``i`` feeds model process ``i % M``; each has its own engine (on a GPU: ``1/M`` of
  the pools' memory, ``models.gpu_memory_share``), and the per-key and total stream caps hold across them
  (serving/shard/ledger.py). For a GPU whose engine outruns one process's Python.
- A process that dies is started again (``RESTART_BACKOFF_S``); a worker's clients resume on any worker (the
  stream log is shared); a model process's successor gets each worker's live streams re-registered.
- SIGTERM / SIGINT: the workers drain (finals logged and sent, clients told to reconnect), then the model process
  ends. A SIGTERM to the whole process group reaches the model processes at once: each serves its workers' drain
  until they hang up (model_process.py ``ModelServer.drain``).
- A key's pixel budget (``limits.max_key_pixels_per_s``) is shared out: each worker paces the key's streams there
  at 1/N of it.
- /metrics on any worker sums every process (serving/shard/metrics.py).
- Stream tickets (``POST /v1/stream-tickets``) are kept in the run directory, shared: any worker redeems them
  (api/shared_tickets.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import MutableSequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from ..config import Settings
from ..errors import LinguaFusionError

log = logging.getLogger("lingua_fusion.api")
RESTART_BACKOFF_S = 1.0
RUN_DIR_PREFIX = "linguafusion-"
OWNER_FILE = "supervisor.pid"
READY_PING_S = 2.0  # /readyz: a model process that does not answer a ping this fast is not serving
STOP_GRACE_S = 15.0  # past the drain deadline, before a worker is killed
START_GRACE_S = 120.0  # a worker's first beat may come this much later than worker_stall_s (imports, app start)
WATCH_GAP_S = 5.0  # the supervisor looks every second; a longer gap means it was not running either


def bind(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def listeners(host: str, port: int, n: int, reuse_port: bool) -> list[socket.socket]:
    """Worker ``i``'s listening socket at ``i``: one shared by all, or one each on the port with ``SO_REUSEPORT``.
    The port is first bound plainly and let go, so that a port already served, by anyone (another LinguaFusion
    server listening with ``SO_REUSEPORT`` included), fails here as it would without it, instead of sharing its
    connections; port 0 picks one free port for all."""
    if not (reuse_port and n > 1 and hasattr(socket, "SO_REUSEPORT")):
        return [bind(host, port)] * n
    with bind(host, port, listen=False) as probe:
        port = probe.getsockname()[1]
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(bind(host, port, reuse_port=True))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _die_with_parent(name: str) -> None:
    """A child ends (SIGTERM) when the supervisor dies, even by SIGKILL: no orphan keeps serving the port. It is
    named ``name`` (at most 15 bytes) in ps, top and /proc/PID/stat: ``lf-worker``, ``lf-model-N``."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME


def model_main(settings: Settings, path: str, log_level: str, index: int = 0, ledger_path: str | None = None) -> None:
    """Model process ``index``; ``ledger_path``: the admitted streams shared with the others (several)."""
    import asyncio

    _die_with_parent(f"lf-model-{index}")
    from ..observability import Metrics
    from ..serving.shard.ledger import SharedLedger
    from ..serving.shard.model_process import serve
    from .server import install_logging

    install_logging(log_level)
    switch_interval(settings)
    s = settings.server
    ledger = None if ledger_path is None else \
        SharedLedger(Path(ledger_path), index, key_limit=s.max_streams_per_key, total_limit=s.max_streams)
    asyncio.run(serve(path, settings, Metrics(), ledger=ledger))


def switch_interval(settings: Settings) -> float:
    """``models.switch_interval_ms`` as this process's switch interval (its GPU runner threads and event loop share
    Python's lock); the interval in force, in seconds."""
    if settings.models.switch_interval_ms is not None:
        sys.setswitchinterval(settings.models.switch_interval_ms / 1000)
    return sys.getswitchinterval()


def worker_main(settings: Settings, sock: socket.socket, path: str, log_level: str,
                beats: MutableSequence[float] | None = None, index: int = 0) -> None:
    """One stream worker: the app, serving on its listening socket, its streams' models in the model process."""
    from ..models.registry import Registry
    from ..observability import Metrics
    from ..serving.engine import Engine
    from ..serving.ports import StageObserver
    from ..serving.shard.remote import ModelLink, RemotePort, link_in_flight
    from ..serving.shard.worker_vad import worker_vad
    from .app import create_app
    from .deps import app_state
    from .server import build_server, install_logging
    from .shared_tickets import SharedTicketBook

    _die_with_parent("lf-worker")
    install_logging(log_level)
    link = ModelLink(path, max_in_flight=link_in_flight(settings), ring=settings.server.shm_ring)

    def port(registry: Registry, s: Settings, metrics: Metrics, /, *, observer: StageObserver) -> Engine:
        # this worker's SLO breakers hear its streams; its streams' VAD runs here (models.vad_in_workers)
        vad = worker_vad(registry, s, metrics) if s.models.vad_in_workers else None
        return RemotePort(link, registry, s, observer=observer, vad=vad)

    # nothing to warm here: streams' and files' model work alike runs in the model process, which warms its own
    app = create_app(settings, executor=port, warm=False)
    state = app_state(app)
    # a ticket issued by one worker opens a stream on any (api/shared_tickets.py); the file lives in the run dir
    if not settings.state.redis_url:  # with Redis, the book there is every server's already (api/redis_tickets.py)
        state.tickets = SharedTicketBook(Path(path).parent / "tickets.db")

    async def model_check() -> str | None:  # /readyz: this worker's model process answers (api/health.py)
        try:
            await link.ping(READY_PING_S)
            return None
        except LinguaFusionError as exc:
            return f"{exc.code}: {exc.message}"

    async def engine_state() -> dict[str, str]:  # /readyz: the model process's warm engine runners (engine_warm)
        try:
            states = (await link.call({"op": "engine"}, READY_PING_S))["value"]  # by model: "ready", "building"...
            return dict(states) if isinstance(states, dict) else {}
        except LinguaFusionError:
            return {}  # model_check says why

    state.model_check = model_check
    if settings.models.engine_warm_langs():  # its model process builds them at start
        state.engine_state = engine_state
    if not settings.state.redis_url:  # in-process rooms would be one worker's: a listener on another finds none
        state.rooms.unavailable = ("rooms need a shared Redis when the server runs several worker processes: "
                                       "set LINGUAFUSION_STATE__REDIS_URL, or serve without --workers")
    heartbeat = SharedBeat(beats, index) if beats is not None else None
    build_server(app, settings, log_level=log_level, heartbeat=heartbeat).run(sockets=[sock])


class SharedBeat:
    """A worker's heartbeat (api/server.py ``Heartbeat``) in the supervisor's shared array: the last beat's
    ``time.monotonic()`` (one clock in every process), or infinity once it drains (never stalled)."""

    def __init__(self, beats: MutableSequence[float], index: int) -> None:
        self.beats, self.index = beats, index

    def beat(self) -> None:
        self.beats[self.index] = time.monotonic()

    def draining(self) -> None:
        self.beats[self.index] = math.inf


def sweep_stale_run_dirs() -> list[str]:
    """Remove the run directories (sockets, metrics files, ledger) of supervisors that are gone: killed with SIGKILL,
    one cannot clean up after itself. A directory is stale when its owner file names a process that no longer
    exists; one without that file (being made right now, or an older version's) is left alone."""
    removed = []
    for d in Path(tempfile.gettempdir()).glob(RUN_DIR_PREFIX + "*"):
        try:
            if d.stat().st_uid != os.getuid():
                continue
            pid = int((d / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
        except PermissionError:  # another user's live process
            continue
    if removed:
        log.info("removed %d run directories of supervisors that are gone", len(removed))
    return removed


def shared_out(settings: Settings, workers: int, model_processes: int) -> Settings:
    """The settings each process is started with: what is one machine's or one key's, divided among them."""
    out = settings.model_copy(deep=True)
    m = out.models
    m.gpu_memory_share /= model_processes  # each engine's share of the pools' memory
    m.asr_threads = max(1, m.asr_threads // model_processes)  # ... and of the cores for CPU models
    # a key's pixel budget (stream/budget.py) is kept by each worker for the key's streams there: each gets 1/N, so
    # that the key's streams together, wherever they land, decode at most limits.max_key_pixels_per_s (with a full
    # rate per worker, a key's four image floods on two workers had twice the OCR of one process, and another
    # key's captions came 10 s late on the 2-core machine)
    out.limits.max_key_pixels_per_s /= workers
    return out


class Supervisor:
    def __init__(self, settings: Settings, workers: int, log_level: str = "info", model_processes: int = 1) -> None:
        if not 1 <= model_processes <= workers:
            raise ValueError("model processes must be between 1 and the number of workers")
        self.settings = shared_out(settings, workers, model_processes)
        self.n = workers
        self.log_level = log_level
        sweep_stale_run_dirs()
        self.run_dir = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX)  # 0700: the model sockets and the metrics files
        Path(self.run_dir, OWNER_FILE).write_text(str(os.getpid()))
        self.paths = [os.path.join(self.run_dir, f"model-{j}.sock") for j in range(model_processes)]
        self.ledger = os.path.join(self.run_dir, "admitted.db") if model_processes > 1 else None
        self.ctx = multiprocessing.get_context("spawn")
        self.stopping = False
        self.models: list[BaseProcess | None] = [None] * model_processes
        self.workers: list[BaseProcess | None] = [None] * workers
        self.restarts = 0
        self.socks: list[socket.socket] = []  # worker i's listening socket at i (``listeners``)
        # worker i's last beat at i (time.monotonic(), the same clock in every process), and when it started
        self.beats = self.ctx.RawArray("d", workers)
        self.started = [0.0] * workers
        self._watched = time.monotonic()  # the last look at the beats
        self._recorded = ""

    def run(self) -> None:
        os.makedirs(os.path.join(self.run_dir, "metrics"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(self.run_dir, "metrics")
        os.environ["LINGUAFUSION_SUPERVISOR_PID"] = str(os.getpid())
        try:
            s = self.settings.server
            self.socks = listeners(s.host, s.port, self.n, s.reuse_port)
        except OSError:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        try:
            self._prepare_state()
            for j in range(len(self.models)):
                self.models[j] = self._start_model(j)
            for i in range(self.n):
                self.workers[i] = self._start_worker(i)
            log.info("serving with %d stream workers and %d model process(es) (%s)", self.n, len(self.models),
                     self.run_dir)
            self._record()
            while not self.stopping:
                self._watch()
                self._record()
        finally:
            self._shutdown()
            for sock in set(self.socks):
                sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            if self._recorded:  # its pids are gone: an operator (or a test) must not signal whoever gets them next
                with contextlib.suppress(OSError):
                    (self.settings.resolved_state_dir() / "serve.json").unlink()

    def _prepare_state(self) -> None:
        """The SQLite stream log made (and switched to WAL) once, here, before the workers open it together: two
        processes switching a fresh file's journal mode at once can get 'database is locked' at once."""
        if not self.settings.state.redis_url:
            from ..state.streams import SQLiteStreamStore

            SQLiteStreamStore(self.settings.resolved_state_dir()).close()

    def _start_model(self, j: int) -> BaseProcess:
        p = self.ctx.Process(target=model_main, args=(self.settings, self.paths[j], self.log_level, j, self.ledger),
                             name=f"lf-model-{j}")
        p.start()
        return p

    def _start_worker(self, i: int) -> BaseProcess:
        path = self.paths[i % len(self.paths)]
        p = self.ctx.Process(target=worker_main, name="lf-worker",
                             args=(self.settings, self.socks[i], path, self.log_level, self.beats, i))
        self.started[i] = self.beats[i] = time.monotonic()
        p.start()
        return p

    def _record(self) -> None:
        """``serve.json`` in the state directory: which process is which (for operators, and the tests that kill
        one)."""
        models = [p.pid if p is not None else None for p in self.models]
        pids = {"supervisor": os.getpid(), "model": models[0], "models": models,
                "workers": [p.pid for p in self.workers if p is not None], "restarts": self.restarts}
        path = self.settings.resolved_state_dir() / "serve.json"
        text = json.dumps(pids)
        if text == self._recorded:
            return
        self._recorded = text
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    def _watch(self) -> None:
        live = [p for p in [*self.models, *self.workers] if p is not None]
        multiprocessing.connection.wait([p.sentinel for p in live], timeout=1.0)
        if self.stopping:
            return
        from prometheus_client import multiprocess

        for j, m in enumerate(self.models):
            if m is not None and not m.is_alive():
                log.error("model process %s ended (exit %s); starting another", m.pid, m.exitcode)
                multiprocess.mark_process_dead(m.pid)  # type: ignore[arg-type]
                m.join()
                if self.ledger is not None:  # its streams stop counting against their keys now
                    from ..serving.shard.ledger import drop_process

                    drop_process(Path(self.ledger), j)
                time.sleep(RESTART_BACKOFF_S)
                self.restarts += 1
                self.models[j] = self._start_model(j)
        now = time.monotonic()
        self._looked(now)
        for i, p in enumerate(self.workers):
            if p is not None and p.is_alive() and (silent := self._stalled(i, now)):
                log.error("stream worker %s has not run its event loop for %.0f s; killing it", p.pid, silent)
                p.kill()
                p.join(1)  # (a process in an uninterruptible wait ends later: killed again and joined next turn)
            if p is not None and not p.is_alive():
                log.error("stream worker %s ended (exit %s); starting another", p.pid, p.exitcode)
                multiprocess.mark_process_dead(p.pid)
                p.join()
                time.sleep(RESTART_BACKOFF_S)
                self.restarts += 1
                self.workers[i] = self._start_worker(i)

    def _looked(self, now: float) -> None:
        """A look at the beats at ``now``. After a gap in the looks this process did not run either (the group
        stopped, the machine slept), and the workers' silence is no sign of a hang: their counts start again."""
        if now - self._watched > WATCH_GAP_S:
            for i, started in enumerate(self.started):
                if self.beats[i] == started:  # not beaten yet: its start's grace counts from now
                    self.started[i] = self.beats[i] = now
                elif math.isfinite(self.beats[i]):  # (infinite: draining)
                    self.beats[i] = now
        self._watched = now

    def _stalled(self, i: int, now: float) -> float:
        """Seconds worker ``i``'s loop has been silent, if past ``server.worker_stall_s`` (0: it beats, drains, or
        is still starting within ``START_GRACE_S`` more)."""
        stall = self.settings.server.worker_stall_s
        silent = now - self.beats[i]
        first = self.beats[i] == self.started[i]  # no beat yet
        limit = stall + (START_GRACE_S if first else 0.0)
        return silent if stall > 0 and silent > limit else 0.0

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True

    def _shutdown(self) -> None:
        workers = [p for p in self.workers if p is not None and p.is_alive()]
        for p in workers:  # drain: uvicorn's shutdown runs the StreamService's drain first (api/server.py)
            os.kill(p.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + self.settings.server.drain_timeout_s + STOP_GRACE_S
        for p in workers:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        models = [m for m in self.models if m is not None and m.is_alive()]
        for m in models:
            m.terminate()
        for m in models:
            m.join(10)
            if m.is_alive():
                m.kill()
                m.join(5)


def serve_sharded(settings: Settings, workers: int, log_level: str = "info", model_processes: int = 1) -> None:
    Supervisor(settings, workers, log_level, model_processes).run()
