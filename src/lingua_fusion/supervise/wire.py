"""The framed protocol between the server and a worker process, over the worker's stdin / stdout (stdlib only):

    frame   = header json payload
    header  = struct "<4sIII": magic (4 bytes, one per kind of worker), request id, len(json), len(payload)

One request at a time, one response per request, with the request's id. A response's json is ``{"ok": true, ...}``
or ``{"ok": false, "error": str}`` (the worker goes on). The vision worker (vision/worker.py) speaks the same frames
with its own copy of these few lines: it runs under another interpreter and imports nothing of this package.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Mapping
from typing import IO

HEADER_FORMAT = "<4sIII"
MAX_JSON = 16 << 20
MAX_PAYLOAD = 256 << 20


def read_exact(stream: IO[bytes], n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def send(out: IO[bytes], header: struct.Struct, magic: bytes, rid: int, body: Mapping[str, object],
         payload: bytes = b"") -> None:
    raw = json.dumps(body, ensure_ascii=False).encode()
    out.write(header.pack(magic, rid, len(raw), len(payload)) + raw + payload)
    out.flush()


def protocol_stdout() -> IO[bytes]:
    """The protocol's own copy of stdout; file descriptor 1 (and sys.stdout) then point at stderr, so that nothing a
    library prints, from Python or from C, can fall into the protocol stream."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out
