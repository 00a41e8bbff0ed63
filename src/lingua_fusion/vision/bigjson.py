"""JSON of megabytes (landmark examples, vocabulary imports and exports), parsed and written so that a worker
thread doing it lets the event loop run.

A thread only helps where Python bytecode runs: the interpreter hands the GIL over between bytecodes, never inside
one C call. ``json.loads`` and ``json.dumps`` of 16 MB are single C calls of about a second (measured:
``bench/vocab_loop.py``), during which every other request of the server waits. So:

- ``loads``: ``json.loads`` with an ``object_hook`` written in Python: the C scanner calls it once per JSON object
  (once per landmark frame), and each call is a point where the event loop's thread can take the GIL back. The hook
  also turns a frame's point arrays (the values of ``left_hand``, ``right_hand``, ``pose`` and ``lips``, each
  ``[[x, y], ...]``) into one float64 ``numpy`` array each as soon as the frame is parsed: a 16 MB body is about
  a million small lists, and holding them all alive made the cyclic garbage collector walk them again and again
  (generation-2 passes of 50-270 ms each, holding the GIL whatever thread it runs in).
  ``landmarks.LandmarkSeq.from_json`` does the same ``np.asarray(value, dtype=float64)`` on every part, so what it
  accepts and refuses is unchanged; a value that does not convert stays a list.
- ``dumps``: objects and lists of objects are written piece by piece, each leaf (a frame's point lists) by one
  small C ``json.dumps`` call.

A hook runs only at the end of an object, so a body of plain lists (``{"frames": [[], [], ...]}``, 16 MiB of them)
gave the scanner one C call of seconds: ``loads`` refuses, before parsing, a body with more than ``MAX_RUN_BYTES``
between two objects (a landmark frame is an object of about 2 KB; an attacker's lists are refused in ~20 ms of
numpy that lets other threads run).

Both are strict as ``strict_json.loads`` (NaN / Infinity and lone surrogates are a ``ValueError``; given ``bounds``,
``loads`` measures the body's depth and elements after the run check and before parsing: json_bounds.py). Call them off
the event loop (``asyncio.to_thread``); on the loop they block as long as the plain calls.
"""

from __future__ import annotations

import json
import re
from typing import NoReturn

import numpy as np

from ..errors import InvalidParameter
from ..json_bounds import JsonBounds, check
from .landmarks import PARTS

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
MAX_RUN_BYTES = 64 * 1024  # the most bytes between two JSON objects' starts (the scanner's longest run without a hook)


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _each_object(obj: dict[str, object]) -> dict[str, object]:
    """Called by the C scanner once per JSON object: a point where the GIL can change hands."""
    for k, v in obj.items():
        if k in PARTS and isinstance(v, list) and v and isinstance(v[0], list):
            try:
                arr = np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                continue
            if arr.ndim == 2:
                obj[k] = arr
    return obj


def longest_run(raw: bytes) -> int:
    """The most bytes of ``raw`` before, between or after its object starts (``{``, counted in strings too: the
    bound is conservative)."""
    starts = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == ord("{"))
    if not len(starts):
        return len(raw)
    return int(max(starts[0], len(raw) - starts[-1], np.diff(starts).max(initial=0)))


def loads(raw: bytes, bounds: JsonBounds | None = None) -> object:
    """The value of a JSON body; ``ValueError`` if it is not strict JSON, ``RecursionError`` if nested too deep,
    ``InvalidParameter`` if it has a run over ``MAX_RUN_BYTES`` without an object (``longest_run``), ``TooLarge``
    if it is past ``bounds``."""
    if len(raw) > MAX_RUN_BYTES and (run := longest_run(raw)) > MAX_RUN_BYTES:
        raise InvalidParameter(f"{run} bytes of the body without a JSON object: landmark bodies are objects (one per "
                               f"frame) at most {MAX_RUN_BYTES} bytes apart", details={"limit": "max_run_bytes"})
    if bounds is not None:
        check(raw, bounds)
    obj = json.loads(raw, parse_constant=_not_json, object_hook=_each_object)
    if _SURROGATE.search(raw) is not None:  # rare: only then is every string checked
        try:
            for chunk in _chunks(obj):
                chunk.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a lone UTF-16 surrogate (\\ud800-\\udfff) is not a character") from None
    return obj


def dumps(obj: object) -> bytes:
    """``json.dumps(obj)`` (compact) as UTF-8 bytes, written in pieces."""
    return "".join(_chunks(obj)).encode("utf-8")


def _chunks(obj: object) -> list[str]:
    out: list[str] = []
    _write(obj, out)
    return out


def _write(obj: object, out: list[str]) -> None:
    if isinstance(obj, dict):
        out.append("{")
        for i, (k, v) in enumerate(obj.items()):
            out.append(("," if i else "") + json.dumps(str(k), ensure_ascii=False) + ":")
            _write(v, out)
        out.append("}")
    elif isinstance(obj, list) and obj and (isinstance(obj[0], dict) or isinstance(obj[0], list) and len(obj[0]) > 2):
        # a list of objects or of long lists, piece by piece; a frame's [[x, y], ...] is one leaf
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _write(v, out)
        out.append("]")
    elif isinstance(obj, np.ndarray):  # from loads: numbers only
        out.append(json.dumps(obj.tolist(), separators=(",", ":")))
    else:
        out.append(json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False))
