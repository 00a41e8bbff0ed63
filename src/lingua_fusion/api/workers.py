"""``linguafusion serve --workers N``: N stream worker processes and one model process, supervised.

- The supervisor (this process) binds the listening socket once and hands it to every worker, as uvicorn's own
  ``--workers`` does: each worker accepts on it (the kernel gives a new connection to one waiting worker; a busy
  worker reaches ``accept`` later, so new streams tend to land on the less busy one). A live stream stays on the
  worker that accepted its WebSocket.
- Each worker runs the whole app (routes, auth, the StreamService: sessions, VAD bookkeeping, policies, journal,
  event encoding, WebSocket I/O, file requests) with its live streams' ModelPort pointing at the model process
  (serving/shard/remote.py).
- The model process (serving/shard/model_process.py) holds the models, the one executor and scheduler that
  batches every worker's streams, and admission (stream load and per-key stream counts across workers).
- A process that dies is started again (``RESTART_BACKOFF_S``); a worker's clients resume on any worker (the
  stream log is shared); a model process's successor gets each worker's live streams re-registered.
- SIGTERM / SIGINT: the workers drain (finals logged and sent, clients told to reconnect), then the model process
  ends.
- /metrics on any worker sums every process (serving/shard/metrics.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.process import BaseProcess
from typing import Any

from ..config import Settings

log = logging.getLogger("lingua_fusion.api")
RESTART_BACKOFF_S = 1.0
STOP_GRACE_S = 15.0  # past the drain deadline, before a worker is killed


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    """A child ends (SIGTERM) when the supervisor dies, even by SIGKILL: no orphan keeps serving the port."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def model_main(settings: Settings, path: str, log_level: str) -> None:
    """The model process."""
    import asyncio

    _die_with_parent()
    from ..observability import Metrics
    from ..serving.shard.model_process import serve
    from .server import install_logging

    install_logging(log_level)
    asyncio.run(serve(path, settings, Metrics()))


def worker_main(settings: Settings, sock: socket.socket, path: str, log_level: str) -> None:
    """One stream worker: the app, serving on the shared socket, its streams' models in the model process."""
    from ..models.registry import Registry
    from ..observability import Metrics
    from ..serving.shard.remote import ModelLink, RemotePort
    from .app import create_app
    from .server import build_server, install_logging

    _die_with_parent()
    install_logging(log_level)
    link = ModelLink(path)

    def port(registry: Registry, s: Settings, _metrics: Metrics) -> Any:
        return RemotePort(link, registry, s)

    app = create_app(settings, executor=port)
    build_server(app, settings, log_level=log_level).run(sockets=[sock])


class Supervisor:
    def __init__(self, settings: Settings, workers: int, log_level: str = "info") -> None:
        self.settings = settings
        self.n = workers
        self.log_level = log_level
        self.run_dir = tempfile.mkdtemp(prefix="linguafusion-")  # 0700: the model socket and the metrics files
        self.path = os.path.join(self.run_dir, "model.sock")
        self.ctx = multiprocessing.get_context("spawn")
        self.stopping = False
        self.model: BaseProcess | None = None
        self.workers: list[BaseProcess | None] = [None] * workers
        self.restarts = 0
        self._recorded = ""

    def run(self) -> None:
        os.makedirs(os.path.join(self.run_dir, "metrics"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(self.run_dir, "metrics")
        os.environ["LINGUAFUSION_SUPERVISOR_PID"] = str(os.getpid())
        try:
            sock = bind(self.settings.server.host, self.settings.server.port)
        except OSError:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        try:
            self.model = self._start_model()
            for i in range(self.n):
                self.workers[i] = self._start_worker(sock)
            log.info("serving with %d stream workers and a model process (%s)", self.n, self.path)
            self._record()
            while not self.stopping:
                self._watch(sock)
                self._record()
        finally:
            self._shutdown()
            sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _start_model(self) -> BaseProcess:
        p = self.ctx.Process(target=model_main, args=(self.settings, self.path, self.log_level), name="lf-model")
        p.start()
        return p

    def _start_worker(self, sock: socket.socket) -> BaseProcess:
        p = self.ctx.Process(target=worker_main, args=(self.settings, sock, self.path, self.log_level),
                             name="lf-worker")
        p.start()
        return p

    def _record(self) -> None:
        """``serve.json`` in the state directory: which process is which (for operators, and the tests that kill
        one)."""
        pids = {"supervisor": os.getpid(), "model": self.model.pid if self.model else None,
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

    def _watch(self, sock: socket.socket) -> None:
        live = [p for p in [self.model, *self.workers] if p is not None]
        multiprocessing.connection.wait([p.sentinel for p in live], timeout=1.0)
        if self.stopping:
            return
        from prometheus_client import multiprocess

        if self.model is not None and not self.model.is_alive():
            log.error("the model process %s ended (exit %s); starting another", self.model.pid, self.model.exitcode)
            multiprocess.mark_process_dead(self.model.pid)
            self.model.join()
            time.sleep(RESTART_BACKOFF_S)
            self.restarts += 1
            self.model = self._start_model()
        for i, p in enumerate(self.workers):
            if p is not None and not p.is_alive():
                log.error("stream worker %s ended (exit %s); starting another", p.pid, p.exitcode)
                multiprocess.mark_process_dead(p.pid)
                p.join()
                time.sleep(RESTART_BACKOFF_S)
                self.restarts += 1
                self.workers[i] = self._start_worker(sock)

    def _stop(self, signum: int, _frame: Any) -> None:
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
        if self.model is not None and self.model.is_alive():
            self.model.terminate()
            self.model.join(10)
            if self.model.is_alive():
                self.model.kill()
                self.model.join(5)


def serve_sharded(settings: Settings, workers: int, log_level: str = "info") -> None:
    Supervisor(settings, workers, log_level).run()
