"""The wire between stream workers and the model process: length-prefixed msgpack frames over a Unix socket.

A frame is a 4-byte big-endian length and a msgpack map (one message) or an array of maps (the messages one side
wrote in one turn of its event loop, sent as one frame in one write: ``Outbox``; at hundreds of streams a worker
sends thousands of small requests a second, and a frame, a read and a write each is what the model process's one
event loop would otherwise spend its time on). Only a closed set of types crosses it (no pickle: the
model process never runs code it was sent): msgpack's own types, ``np.ndarray`` as dtype, shape and its raw bytes
(audio travels as float32 bytes, images as uint8; from a worker whose ring the model process mapped, one of 64 KB
or more travels as its place in that ring: shm.py), the ports' payloads and results (``AsrInput``, ``AsrOutput``,
``MtInput``, ``Term``, ``OCRLine``; a file's ``TranscribeInput``, ``ASRResult``, ``ASRSegment``, ``ASRWord``,
``OcrInput``, ``SpeakerInput``; a stream's ``DetectInput``), ``Demand``, and ``LinguaFusionError`` by class name,
message, details and retry_after (``error_of``). Anything else is a ``TypeError`` at the sender.

Messages (``op``): worker -> model ``run`` {id, key, mode, payload, ctx, traceparent (tracing on only)}, ``admit``
{id, demand, key_id, mode, force}, ``release`` {stream_id, mode}, ``depth``-less (every reply carries its key's
depth), ``ping`` {id};
model -> worker ``ok`` {id, value, depth}, ``err`` {id, error}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import struct

import msgpack
import numpy as np

from ... import errors
from ...glossary import Term
from ...models.base import ASRResult, ASRSegment, ASRWord, OCRLine
from ..keys import ModelKey
from ..ports import AsrInput, AsrOutput, DetectInput, MtInput, OcrInput, SpeakerInput, TranscribeInput
from ..scheduler import Demand
from . import shm

# the largest image a client may send (limits.max_image_pixels, 40 MP) is 120 MB as RGB pixels for OCR; a 4 MiB
# PCM16 message is 131 s, 8 MiB as float32. Over this, a call fails typed (BackendError), the link goes on
MAX_FRAME = 160 * 1024 * 1024
_HEAD = struct.Struct(">I")
_TYPES: dict[str, type] = {t.__name__: t for t in (AsrInput, AsrOutput, MtInput, Term, OCRLine, Demand,
                                                   TranscribeInput, OcrInput, ASRResult, ASRSegment, ASRWord,
                                                   SpeakerInput, DetectInput)}
# one message: string keys, values of the closed set of types above (msgpack decodes into plain dicts)
Message = dict[str, object]
# fields rebuilt as tuples (hashable: MT compiles a glossary once per tuple; a DetectInput's candidates)
_TUPLES = {"glossary", "names", "box", "candidates"}


def _default(obj: object, ring: shm.Ring | None = None, spans: list[int] | None = None) -> object:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if ring is not None and spans is not None and arr.nbytes >= shm.MIN_BYTES and not arr.dtype.hasobject:
            at = ring.put(arr)
            if at is not None:  # in the worker's shared ring (shm.py): its place crosses, not its bytes
                spans.append(at)
                return {"__shm": at, "n": arr.nbytes, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        return {"__nd": arr.dtype.str, "shape": list(arr.shape), "data": arr.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Demand):  # its models by name: a ModelKey is no map key on the wire
        return {"__t": "Demand", "stream_id": obj.stream_id, "slo": obj.slo,
                "rate": {str(k): v for k, v in obj.rate.items()}}
    if dataclasses.is_dataclass(obj) and type(obj).__name__ in _TYPES:
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"__t": type(obj).__name__, **fields}
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} cannot cross to the model process")


def _hook(m: dict[str, object], view: shm.View | None = None) -> object:
    if "__shm" in m:
        if view is None:
            raise ValueError("a shared array on a connection whose ring is not mapped")
        return view.read(m["__shm"], m.get("n"), m.get("dtype"), m.get("shape"))
    if "__nd" in m:
        # a copy: backends may write into their input (the wire buffer is read-only)
        data, dtype, shape = m["data"], m["__nd"], m["shape"]
        if not (isinstance(data, bytes) and isinstance(dtype, str) and isinstance(shape, list)):
            raise ValueError("a malformed array on the model wire")
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
    name = m.pop("__t", None)
    if name is None:
        return m
    cls = _TYPES.get(str(name))
    if cls is None:
        raise ValueError(f"unknown type {name!r} on the model wire")
    if cls is Demand:
        rate = m.get("rate")
        if not isinstance(rate, dict):
            raise ValueError("a malformed demand on the model wire")
        return Demand(str(m.get("stream_id")), str(m.get("slo")),
                      {ModelKey.parse(str(k)): float(v) for k, v in rate.items()})
    return cls(**{k: tuple(v) if k in _TUPLES and isinstance(v, list) else v for k, v in m.items()})


def encode(msg: Message) -> bytes:
    body: bytes = msgpack.packb(msg, default=_default, use_bin_type=True)  # msgpack is untyped
    if len(body) > MAX_FRAME:
        raise ValueError(f"a model message of {len(body)} bytes is over {MAX_FRAME}")
    return _HEAD.pack(len(body)) + body


def decode(body: bytes) -> Message:
    msgs = decode_many(body)
    if len(msgs) != 1:
        raise ValueError("expected one model message, got a batch")
    return msgs[0]


def decode_many(body: bytes, view: shm.View | None = None) -> list[Message]:
    """The messages of one frame: a map, or an array of maps; ``view``: the sender's ring, where it has one."""
    hook = _hook if view is None else functools.partial(_hook, view=view)
    msg: object = msgpack.unpackb(body, object_hook=hook, raw=False, strict_map_key=False)  # msgpack is untyped
    msgs = msg if isinstance(msg, list) else [msg]
    maps = [m for m in msgs if isinstance(m, dict)]
    if not msgs or len(maps) != len(msgs):
        raise ValueError("a model message must be a map")
    return maps


async def read_frame(reader: asyncio.StreamReader) -> Message:
    """The next message (a frame of exactly one). Raises ``asyncio.IncompleteReadError`` at the end of the stream,
    ``ValueError`` on a frame that is too large or not ours."""
    msgs = await read_frames(reader)
    if len(msgs) != 1:
        raise ValueError("expected one model message, got a batch")
    return msgs[0]


async def read_frames(reader: asyncio.StreamReader, view: shm.View | None = None) -> list[Message]:
    """The messages of the next frame (one, or the batch an ``Outbox`` sent)."""
    (n,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if n > MAX_FRAME:
        raise ValueError(f"a model frame of {n} bytes is over {MAX_FRAME}")
    return decode_many(await reader.readexactly(n), view)


class Outbox:
    """Messages written during one turn of the event loop leave together, at the end of it: as one frame (an array
    of the messages' maps) and one write. Each message is encoded when it is put, so a payload that cannot cross
    raises at the caller. A frame holds at most ``batch_bytes`` (then the next one starts). With a ``ring`` (a
    worker's, once the model process has mapped it: shm.py), large arrays cross through it."""

    def __init__(self, writer: asyncio.StreamWriter, *, batch_bytes: int = 4 * 1024 * 1024) -> None:
        self.writer = writer
        self.batch_bytes = batch_bytes
        self.ring: shm.Ring | None = None
        self.frames = self.messages = 0  # what was sent (the tests and the benchmark read them)
        self._bodies: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def put(self, msg: Message, *, shared: bool = True) -> list[int]:
        """Queue ``msg``; the ring spans it holds (the caller releases them when the model process has read them:
        remote.py ModelLink). ``shared`` False: every array inline (a message with no reply to release them at)."""
        spans: list[int] = []
        ring = self.ring if shared else None
        default = _default if ring is None else functools.partial(_default, ring=ring, spans=spans)
        try:
            body = msgpack.packb(msg, default=default, use_bin_type=True)
            if len(body) > MAX_FRAME - 16:
                raise ValueError(f"a model message of {len(body)} bytes is over {MAX_FRAME}")
            if self._size + len(body) > self.batch_bytes:
                self.flush()
        except BaseException:
            if ring is not None:  # nothing is sent: nobody will read its spans
                for at in spans:
                    ring.release(at)
            raise
        self._bodies.append(body)
        self._size += len(body)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return spans

    def flush(self) -> None:
        self._scheduled = False
        bodies, self._bodies, self._size = self._bodies, [], 0
        if not bodies or self.writer.is_closing():
            return  # a connection that ended: its requests fail from the reader's side
        self.frames += 1
        self.messages += len(bodies)
        if len(bodies) == 1:
            self.writer.write(_HEAD.pack(len(bodies[0])) + bodies[0])
            return
        head = _array_head(len(bodies))
        self.writer.write(b"".join([_HEAD.pack(len(head) + sum(map(len, bodies))), head, *bodies]))


def _array_head(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items (the items follow, already encoded)."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def error_to_wire(exc: BaseException) -> Message:
    if isinstance(exc, errors.LinguaFusionError):
        return {"cls": type(exc).__name__, "message": exc.message, "details": exc.details,
                "retry_after": exc.retry_after}
    return {"cls": "BackendError", "message": f"{type(exc).__name__}: {exc}", "details": {}, "retry_after": None}


def error_of(wire: object) -> errors.LinguaFusionError:
    """The typed error a reply carries (an unknown class name becomes a BackendError)."""
    if not isinstance(wire, dict):
        wire = {}
    cls = getattr(errors, str(wire.get("cls")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.LinguaFusionError)):
        cls = errors.BackendError
    message, details = str(wire.get("message", "")), wire.get("details") or {}
    if not isinstance(details, dict):
        details = {}
    if issubclass(cls, errors.Overloaded):
        retry_after = wire.get("retry_after") or 1.0
        return cls(message, retry_after=float(retry_after) if isinstance(retry_after, int | float | str) else 1.0,
                   details=details)
    return cls(message, details=details)


def integer(value: object) -> int:
    """A count a message carries (a reply's ``depth``, a ping's pid): 0 when absent."""
    return int(value) if isinstance(value, int | float | str) and value else 0
