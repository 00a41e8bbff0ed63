"""Incremental decoding of a compressed live stream (WebM/Opus, Ogg/Opus as browsers' MediaRecorder sends it).

The container arrives in pieces (only the first holds the headers), so one decoder thread per stream reads from a
bounded pipe: ``feed`` appends bytes, ``close`` ends the input, and each decoded 16 kHz mono float32 block (then an
error, if any, then ``None``) is handed to ``sink``, called on the decoder thread; a sink that blocks when its
consumer is behind gives back-pressure all the way to the client.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np

from ..errors import CorruptMedia, InvalidParameter, Overloaded
from ..types import SR
from .audio import check_rate

FORMATS = {"webm", "ogg"}


class _Pipe:
    """A blocking, bounded file-like object the decoder thread reads from."""

    def __init__(self, max_chunks: int = 256, timeout_s: float = 60.0) -> None:
        self._q: queue.Queue[bytes | None] = queue.Queue(maxsize=max_chunks)
        self._buf = b""
        self._eof = False
        self._timeout = timeout_s

    def put(self, data: bytes | None) -> None:
        self._q.put(data, timeout=self._timeout)

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) < n):
            try:
                item = self._q.get(timeout=self._timeout)
            except queue.Empty:
                item = None  # a client that stops sending mid-stream: end the decode, do not hang
            if item is None:
                self._eof = True
                break
            self._buf += item
            if n > 0 and self._buf:
                break  # return what is there: the demuxer asks again
        size = len(self._buf) if n < 0 else min(n, len(self._buf))
        out, self._buf = self._buf[:size], self._buf[size:]
        return out


class StreamDecoder:
    def __init__(self, fmt: str, sink: Callable[[np.ndarray | CorruptMedia | None], None], *,
                 max_seconds: float = 4 * 3600.0) -> None:
        if fmt not in FORMATS:
            raise InvalidParameter(f"audio_format must be pcm16 or one of {sorted(FORMATS)}")
        self.fmt = fmt
        self._pipe = _Pipe()
        self._sink = sink
        self._max_samples = int(max_seconds * SR)
        self._thread = threading.Thread(target=self._run, name=f"decode-{fmt}", daemon=True)
        self._thread.start()

    def feed(self, data: bytes) -> None:
        try:
            self._pipe.put(data)
        except queue.Full as exc:
            raise Overloaded("audio arrives faster than the stream can decode it", retry_after=1.0) from exc

    def close(self) -> None:
        try:
            self._pipe.put(None)
        except queue.Full:
            pass

    def _run(self) -> None:
        import av

        total = 0
        try:
            with av.open(self._pipe, mode="r", format=self.fmt) as container:
                if not container.streams.audio:
                    raise CorruptMedia("the stream has no audio track")
                resampler = av.AudioResampler(format="flt", layout="mono", rate=SR)
                for frame in container.decode(container.streams.audio[0]):
                    check_rate(frame.sample_rate, f"the {self.fmt} stream")
                    for res in resampler.resample(frame):
                        arr = res.to_ndarray().reshape(-1).astype(np.float32)
                        total += arr.size
                        if total > self._max_samples:
                            raise CorruptMedia("stream longer than the duration limit")
                        self._sink(arr)
        except (av.error.FFmpegError, ValueError, OSError, CorruptMedia) as exc:
            err = exc if isinstance(exc, CorruptMedia) else CorruptMedia(f"cannot decode the {self.fmt} stream: {exc}")
            self._sink(err)
        except Exception:  # the sink gave up (consumer gone): end quietly, the stream is closing
            return
        try:
            self._sink(None)
        except Exception:
            return
