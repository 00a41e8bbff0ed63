"""WorkerProcess: one supervised worker process that runs native code the server must survive (llama.cpp first).

The serving process never loads such code itself: it starts the worker (``argv``), speaks wire.py's frames over
its stdin / stdout, and on every failure costs only the request in flight:

- a crash (a signal such as SIGSEGV, an exit, a kill) -> ``BackendFailed`` (``backend_failed``, 503, retryable);
- a missed deadline (a hang) -> the worker is killed, ``ModelTimeout`` (``model_timeout``);
- the next call starts a new worker, after policy.py's backoff; a crash loop makes every call fail at once with
  ``BackendError`` naming the reason, until the cool-down ends (``health()`` says so for /readyz and /v1/models);
- an ``{"ok": false}`` answer (the worker caught an error and lives on) -> ``BackendError`` with its message.

Calls are serialised (one request at a time: the worker's model is single-threaded); the wait for the lock is
bounded by the call's own deadline. The worker's stderr is drained by a thread into a bounded buffer whose last
lines go into the log and the error's message (server-side only: ``public`` hides it from clients).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import select
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn, NotRequired, TypedDict

from ..errors import BackendError, BackendFailed, ModelTimeout
from . import wire
from .policy import RestartPolicy, WorkerState

log = logging.getLogger("lingua_fusion.supervise")
HEADER = struct.Struct(wire.HEADER_FORMAT)
STOP_WAIT_S = 5.0


class WorkerHealthJSON(TypedDict):
    """``WorkerHealth.to_dict()``: a worker in /readyz and `linguafusion models`."""
    state: str
    running: bool
    restarts: int
    crashes: int
    reason: NotRequired[str]


@dataclass(frozen=True)
class WorkerHealth:
    """What /readyz, /v1/models, /metrics and `linguafusion models` say of one worker."""

    name: str
    state: str  # "ready" | "backoff" | "unavailable"
    running: bool
    restarts: int  # starts after the first
    crashes: int
    reason: str = ""  # why it is not ready

    def to_dict(self) -> WorkerHealthJSON:
        body: WorkerHealthJSON = {"state": self.state, "running": self.running, "restarts": self.restarts,
                                "crashes": self.crashes}
        if self.reason:
            body["reason"] = self.reason
        return body


def exit_cause(returncode: int | None) -> str:
    """ "SIGSEGV", "exit status 3", "running"."""
    if returncode is None:
        return "running"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-returncode).name
        return f"signal {-returncode}"
    return f"exit status {returncode}"


class WorkerProcess:
    def __init__(self, name: str, argv: Sequence[str], *, magic: bytes, start_timeout_s: float,
                 policy: RestartPolicy | None = None, env: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.argv = list(argv)
        self.magic = magic
        self.start_timeout_s = start_timeout_s
        self.policy = policy or RestartPolicy()
        self.env = env
        self.clock = clock
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._drainer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._rid = 0

    # ---- the face ------------------------------------------------------------------------------------------------
    def call(self, req: Mapping[str, object], payload: bytes = b"", *,
             timeout_s: float) -> tuple[dict[str, object], bytes]:
        """Send one request, return the worker's answer (json, payload). ``timeout_s`` bounds the answer (a worker
        started for this call gets ``start_timeout_s`` more) and the wait for a call already running."""
        if not self._lock.acquire(timeout=timeout_s):
            raise ModelTimeout(f"{self.name}: busy for {timeout_s:g} s with earlier requests")
        try:
            return self._call_locked(req, payload, timeout_s)
        finally:
            self._lock.release()

    def health(self) -> WorkerHealth:
        verdict = self.policy.verdict(self.clock())
        return WorkerHealth(self.name, verdict.state.name.lower(), self.pid() is not None, max(0, self.starts - 1),
                            self.policy.crashes, verdict.reason)

    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def close(self) -> None:
        with self._lock:
            self._stop()

    # ---- one request ---------------------------------------------------------------------------------------------
    def _call_locked(self, req: Mapping[str, object], payload: bytes,
                     timeout_s: float) -> tuple[dict[str, object], bytes]:
        fresh = self._proc is None or self._proc.poll() is not None
        if fresh:
            if self._proc is not None:  # it died between calls (a kill from outside): a crash all the same
                self._crashed(exit_cause(self._proc.poll()))
            self._start()
        self._rid += 1
        raw = json.dumps(req, ensure_ascii=False).encode()
        deadline = self.clock() + timeout_s + (self.start_timeout_s if fresh else 0.0)
        try:
            self._write(HEADER.pack(self.magic, self._rid, len(raw), len(payload)) + raw + payload)
            magic, rid, jlen, plen = HEADER.unpack(self._read(HEADER.size, deadline))
            if magic != self.magic or rid != self._rid or jlen > wire.MAX_JSON or plen > wire.MAX_PAYLOAD:
                self._crashed("answered out of step")
                raise BackendFailed(f"{self.name} answered out of step ({magic!r}, id {rid}); restarted")
            body = json.loads(self._read(jlen, deadline))
            data = self._read(plen, deadline)
        except ValueError as exc:  # a json body that does not parse: the stream is out of step
            self._crashed("malformed answer")
            raise BackendFailed(f"{self.name} sent a malformed answer: {exc}") from exc
        self.policy.answered()
        if not body.get("ok"):
            raise BackendError(f"{self.name}: {body.get('error')}")
        return body, data

    def _start(self) -> None:
        verdict = self.policy.verdict(self.clock())
        if verdict.state is WorkerState.UNAVAILABLE:
            err = BackendError(f"{self.name} is unavailable: {verdict.reason}")
            err.public = f"this route's model worker is unavailable: {verdict.reason}"  # our words: safe to show
            err.retry_after = verdict.wait_s
            raise err
        if verdict.state is WorkerState.BACKOFF:
            time.sleep(verdict.wait_s)  # a few seconds at most (policy.backoff_s), inside the caller's deadline
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=self.env, start_new_session=True)
        except OSError as exc:
            raise BackendError(f"cannot start {self.name} ({self.argv[0]}): {exc}") from exc
        self.starts += 1
        if self.starts > 1:
            log.warning("%s restarted (start %d; last: %s)", self.name, self.starts, self.policy.last_cause)
        self._stderr.clear()
        self._drainer = threading.Thread(target=self._drain, args=(self._proc,), name=f"{self.name}-stderr",
                                         daemon=True)
        self._drainer.start()

    def _crashed(self, cause: str) -> None:
        self.policy.crashed(self.clock(), cause)
        log.error("%s failed (%s); %s", self.name, cause, self.last_words())
        self._stop()

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self._stderr.append(line.decode("utf-8", "replace").rstrip())

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # a killed process that does not go away
            proc.wait(timeout=STOP_WAIT_S)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()

    def _write(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._gone()

    def _read(self, n: int, deadline: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            left = deadline - self.clock()
            if left <= 0:
                self._crashed("timeout")
                raise ModelTimeout(f"{self.name} did not answer within its deadline; killed")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                self._gone()
            buf += chunk
        return bytes(buf)

    def _gone(self) -> NoReturn:
        """The worker closed its end: it died (wait briefly for its exit status and last words), a crash."""
        assert self._proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):  # closed its stdout but lives on: killed below
            self._proc.wait(timeout=2)
        if self._drainer is not None:
            self._drainer.join(timeout=1.0)
        cause = exit_cause(self._proc.poll())
        self._crashed(cause)
        raise BackendFailed(f"{self.name} died ({cause}) in the middle of a request; restarted on the next one",
                            retry_after=max(1.0, self.policy.verdict(self.clock()).wait_s))

    def last_words(self) -> str:
        lines = [x for x in list(self._stderr)[-3:] if x]
        return "its last words: " + " | ".join(lines) if lines else "it printed nothing"
