"""How deep and how many: a JSON text's nesting and element count, measured before it is parsed (a pure core).

``json.loads`` is one C call: whatever a body holds, the interpreter lock is held until it is all built. Its cost
follows the number of values, not the bytes (4 MiB of ``[],[],...`` took 420 ms; 4 MiB of one string, 4 ms), and
nesting deep enough exhausts the parser (a ``RecursionError`` after the work up to there). So every JSON body and
stream message is measured first, at C / numpy speed, and refused (``TooLarge``, 413 ``too_large``) over
``limits.max_json_depth`` or ``limits.max_json_elements`` (the landmark routes: ``vision.max_json_elements``):

- depth: the most containers open at once (``[]`` is 1, ``[[1]]`` 2, a lone number 0);
- elements: the ``[``, ``{`` and ``,`` outside strings: a container of n values counts n (an empty one 1), so the
  count is about the number of values (an object member counts once).

How: a conservative count first, brackets and commas anywhere, strings included (one ``bytes.translate`` pass that
keeps only those bytes, about 2.5 GB/s); when that is within both bounds nothing else is done (a base64 image or
audio message has none at all). Otherwise
the exact scan: escaped characters are dropped (``\\\\`` pairs, then ``\\"``: a run of backslashes keeps its last one
only when it is odd, and that one escapes the quote after it), every remaining quote flips in / out of a string
(numpy's xor accumulate), and outside strings the running sum of opens (+1) and closes (-1) is the depth. The scan
goes in pieces of ``PIECE`` bytes and stops at the first piece past a bound: a 16 MiB body of ``[[[[...`` costs one
piece, of ``[],[],...`` one piece at ``limits.max_json_elements`` (about 6 MiB of pieces at the landmark routes'
bound). numpy releases the interpreter lock inside its loops, so a scan on a worker thread
lets the event loop run. A text that is not JSON is measured all the same (what it counts is then an
approximation); the parser refuses it afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Settings
from .errors import TooLarge

PIECE = 256 * 1024  # bytes scanned at a time (a bound crossed in a piece stops the scan there)

_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[ord("["), ord("{")]] = 1
_DELTA[[ord("]"), ord("}")]] = -1
_COUNTED = np.zeros(256, dtype=bool)
_COUNTED[[ord("["), ord("{"), ord(",")]] = True
_STRUCTURAL = _COUNTED.copy()
_STRUCTURAL[[ord("]"), ord("}"), ord('"')]] = True
_QUOTE = ord('"')
_NOT_MARKS = bytes(b for b in range(256) if b not in b"[{,")  # deleted by the glance


@dataclass(frozen=True)
class JsonBounds:
    """The most nesting and elements one JSON text may have."""

    max_depth: int
    max_elements: int
    elements_setting: str = "limits.max_json_elements"  # named in the refusal


def bounds_of(settings: Settings) -> JsonBounds:
    """The bounds of every JSON body and message but the landmark routes'."""
    return JsonBounds(settings.limits.max_json_depth, settings.limits.max_json_elements)


def landmark_bounds(settings: Settings) -> JsonBounds:
    """The landmark routes' (vocabulary examples, imports, recognition): many more elements."""
    return JsonBounds(settings.limits.max_json_depth, settings.vision.max_json_elements, "vision.max_json_elements")


@dataclass(frozen=True)
class JsonShape:
    """What the scan found: ``depth`` and ``elements`` (lower bounds when ``stopped``: the scan ended at a bound)."""

    depth: int
    elements: int
    stopped: bool = False


def _bytes(raw: bytes | str) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw


def within_at_a_glance(raw: bytes, bounds: JsonBounds) -> bool:
    """True when counting brackets and commas anywhere (strings included) already shows ``raw`` within ``bounds``:
    the depth is at most the ``[`` and ``{``, the elements at most those and the ``,``. (One C pass keeps only
    those three bytes: 1.4 ms for 4 MiB, where three ``count`` calls took 4 ms.)"""
    marks = raw.translate(None, _NOT_MARKS)
    opens = len(marks) - marks.count(b",")
    return opens <= bounds.max_depth and len(marks) <= bounds.max_elements


def measure(raw: bytes | str, bounds: JsonBounds | None = None) -> JsonShape:
    """The depth and element count of ``raw`` (exact for JSON); with ``bounds``, the scan stops at the first
    piece past one of them (``stopped``)."""
    data = np.frombuffer(_bytes(raw).replace(b"\\\\", b"").replace(b'\\"', b""), dtype=np.uint8)
    depth = peak = elements = 0
    inside = False  # the previous piece ended inside a string
    for lo in range(0, len(data), PIECE):
        piece = data[lo:lo + PIECE]
        marks = piece[_STRUCTURAL[piece]]  # quotes, brackets and commas, in order
        if not len(marks):
            continue
        in_string = np.logical_xor.accumulate(marks == _QUOTE)  # True from an opening quote up to its closing one
        if inside:
            in_string = ~in_string
        outside = ~in_string  # (a quote is neither a bracket nor a comma: how it counts itself does not matter)
        running = np.cumsum(_DELTA[marks] * outside, dtype=np.int64)
        peak = max(peak, depth + int(running.max()))
        depth += int(running[-1])
        elements += int(np.count_nonzero(_COUNTED[marks] & outside))
        inside = bool(in_string[-1])
        if bounds is not None and (peak > bounds.max_depth or elements > bounds.max_elements):
            return JsonShape(peak, elements, stopped=lo + PIECE < len(data))
    return JsonShape(peak, elements)


def check(raw: bytes | str, bounds: JsonBounds) -> None:
    """Refuse ``raw`` (``TooLarge``) when it nests deeper than ``bounds.max_depth`` or holds more than
    ``bounds.max_elements`` elements; nothing is parsed."""
    data = _bytes(raw)
    if within_at_a_glance(data, bounds):
        return
    shape = measure(data, bounds)
    more = "at least " if shape.stopped else ""
    if shape.depth > bounds.max_depth:
        raise TooLarge(f"the JSON nests {more}{shape.depth} deep; at most {bounds.max_depth} (limits.max_json_depth)",
                       details={"limit": "max_json_depth", "max_depth": bounds.max_depth})
    if shape.elements > bounds.max_elements:
        raise TooLarge(f"the JSON holds {more}{shape.elements} elements; at most {bounds.max_elements} (values in "
                       f"arrays and objects; {bounds.elements_setting})", details={"limit": "max_json_elements",
                                                       "max_elements": bounds.max_elements})
