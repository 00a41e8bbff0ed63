"""MediapipeExtractor: the ``LandmarkExtractor`` that runs mediapipe 0.10.21 in a worker process (``worker.py``)
under another interpreter (``.venv-vision``), so the server's environment stays lean and keeps numpy 2.

- One request at a time per extractor (a lock); frames are downscaled to ``max_side`` before they travel.
- Every wait has a deadline (``start_timeout_s`` for the first answer, which imports mediapipe; ``timeout_s`` per
  request); a worker that misses one, dies, or answers out of step is killed and the call raises
  ``ModelTimeout`` / ``BackendError`` (retryable); the next call starts a new worker.
- Its stderr is drained by a thread into a bounded buffer (the last lines go into error messages).

Which interpreter: ``settings.python`` (``LINGUAFUSION_VISION__PYTHON``), else ``.venv-vision/bin/python`` beside
the source tree, else this interpreter if mediapipe is importable here (``pip install linguafusion[vision]``).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError, InvalidParameter, ModelTimeout
from . import worker as wire
from .landmarks import HAND_POINTS, LIP_POINTS, POSE_POINTS, LandmarkFrame

WORKER = Path(wire.__file__)
assert wire.POINTS == 2 * HAND_POINTS + POSE_POINTS + LIP_POINTS
ALL_PARTS = frozenset({"hands", "pose", "lips"})


def default_python(configured: Path | str | None = None) -> Path | None:
    """The interpreter the worker runs under, or None if none is installed."""
    if configured:
        return Path(configured)
    beside = Path(__file__).resolve().parents[3] / ".venv-vision" / "bin" / "python"
    if beside.exists():
        return beside
    if importlib.util.find_spec("mediapipe") is not None:
        return Path(sys.executable)
    return None


class MediapipeExtractor:
    name = "mediapipe-0.10.21"

    def __init__(self, python: Path | str | None = None, *, timeout_s: float = 30.0, start_timeout_s: float = 90.0,
                 max_side: int = 640, max_batch: int = 64, session: str = "default") -> None:
        found = default_python(python)
        if found is None:
            raise BackendError("the vision worker needs mediapipe: run `make setup` (it creates .venv-vision) or "
                               "set LINGUAFUSION_VISION__PYTHON to an interpreter that has mediapipe==0.10.21")
        self.python = found
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.max_side = max_side
        self.max_batch = max_batch
        self.session = session
        self.timings: dict[str, float] = {"hands": 0.0, "pose": 0.0, "lips": 0.0}  # ms spent, summed
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._lock = threading.Lock()
        self._rid = 0
        self._drainer: threading.Thread | None = None

    # ---- the Protocol ------------------------------------------------------------------------------------------
    def extract(self, frames: Sequence[tuple[float, np.ndarray]], *, parts: frozenset[str] = ALL_PARTS,
                session: str | None = None) -> list[LandmarkFrame]:
        """``session``: whose video these frames are (mediapipe follows hands from frame to frame within one);
        default: this extractor's own."""
        if not parts <= ALL_PARTS or not parts:
            raise InvalidParameter(f"parts must be a non-empty subset of {sorted(ALL_PARTS)}")
        out: list[LandmarkFrame] = []
        for start in range(0, len(frames), self.max_batch):
            out.extend(self._extract_batch(frames[start:start + self.max_batch], parts, session or self.session))
        return out

    def close(self) -> None:
        with self._lock:
            self._stop()

    # ---- one batch -----------------------------------------------------------------------------------------------
    def _extract_batch(self, frames: Sequence[tuple[float, np.ndarray]], parts: frozenset[str], session: str
                       ) -> list[LandmarkFrame]:
        meta, chunks = [], []
        for t, rgb in frames:
            small = self._downscale(rgb)
            meta.append({"t": float(t), "w": int(small.shape[1]), "h": int(small.shape[0])})
            chunks.append(np.ascontiguousarray(small, np.uint8).tobytes())
        req = {"op": "extract", "session": session, "parts": sorted(parts), "frames": meta}
        body, payload = self._call(req, b"".join(chunks))
        coords = np.frombuffer(payload, np.float32).reshape(len(frames), wire.POINTS, 2)
        for k, v in body.get("ms", {}).items():
            self.timings[k] = self.timings.get(k, 0.0) + float(v)
        result = []
        for (t, _), flag, pts in zip(frames, body["frames"], coords, strict=True):
            hands = pts[:2 * HAND_POINTS].reshape(2, HAND_POINTS, 2).copy()
            left, right = (bool(x) for x in flag["hands"])
            result.append(LandmarkFrame(float(t), hands, (left, right),
                                        pts[2 * HAND_POINTS:2 * HAND_POINTS + POSE_POINTS].copy(), bool(flag["pose"]),
                                        pts[2 * HAND_POINTS + POSE_POINTS:].copy(), bool(flag["lips"])))
        return result

    def _downscale(self, rgb: np.ndarray) -> np.ndarray:
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise InvalidParameter("frames must be H x W x 3 uint8 RGB arrays")
        step = math.ceil(max(rgb.shape[0], rgb.shape[1]) / self.max_side)
        return rgb[::step, ::step] if step > 1 else rgb

    def hello(self) -> dict[str, Any]:
        """Start the worker if needed and return its versions (mediapipe, numpy)."""
        body, _ = self._call({"op": "hello"}, b"")
        return body

    def close_session(self, session: str) -> None:
        self._call({"op": "close_session", "session": session}, b"")

    # ---- the worker process --------------------------------------------------------------------------------------
    def _call(self, req: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        with self._lock:
            fresh = self._proc is None or self._proc.poll() is not None
            if fresh:
                self._start()
            self._rid += 1
            raw = json.dumps(req).encode()
            deadline = time.monotonic() + (self.start_timeout_s if fresh else self.timeout_s)
            try:
                self._write(wire.HEADER.pack(wire.MAGIC, self._rid, len(raw), len(payload)) + raw + payload)
                magic, rid, jlen, plen = wire.HEADER.unpack(self._read(wire.HEADER.size, deadline))
                if magic != wire.MAGIC or rid != self._rid or jlen > wire.MAX_JSON or plen > wire.MAX_PAYLOAD:
                    raise BackendError(f"the vision worker answered out of step ({magic!r}, id {rid})")
                body = json.loads(self._read(jlen, deadline))
                data = self._read(plen, deadline)
            except (BackendError, OSError, ValueError) as exc:
                self._stop()
                if isinstance(exc, BackendError):
                    raise
                raise BackendError(f"the vision worker failed: {exc}; {self._last_stderr()}") from exc
        if not body.get("ok"):
            raise BackendError(f"the vision worker could not extract landmarks: {body.get('error')}")
        return body, data

    def _start(self) -> None:
        self._stop()
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the worker must not import this environment's numpy 2
        env.setdefault("GLOG_minloglevel", "2")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        try:
            self._proc = subprocess.Popen([str(self.python), "-I", str(WORKER)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                          start_new_session=True)
        except OSError as exc:
            raise BackendError(f"cannot start the vision worker with {self.python}: {exc}") from exc
        self.restarts += 1
        self._stderr.clear()
        self._drainer = threading.Thread(target=self._drain, args=(self._proc,), name="vision-stderr", daemon=True)
        self._drainer.start()

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
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a killed process that does not go away
            pass
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()

    def _write(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise BackendError(f"the vision worker is gone: {self._last_stderr()}") from exc

    def _read(self, n: int, deadline: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelTimeout(f"the vision worker did not answer within its deadline; {self._last_stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:  # it exited: wait (briefly) for its last words to be read
                with contextlib.suppress(subprocess.TimeoutExpired):  # closed its stdout but lives on
                    self._proc.wait(timeout=2)
                if self._drainer is not None:
                    self._drainer.join(timeout=1.0)
                raise BackendError(f"the vision worker exited (status {self._proc.poll()}); {self._last_stderr()}")
            buf += chunk
        return bytes(buf)

    def _last_stderr(self) -> str:
        lines = [x for x in list(self._stderr)[-3:] if x]
        return "its last words: " + " | ".join(lines) if lines else "it printed nothing"
