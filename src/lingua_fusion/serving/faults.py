"""Model backend faults: chaos injection (server started with ``--chaos``) and the output checks that catch them.

A fault applies to the model keys starting with its ``model`` prefix (``asr``, ``mt``, ``ocr``, ``tts``, ``*``) and
to a ``fraction`` of the batches run after the first ``after`` ones:

  delay    the batch waits ``delay_s`` (plus ``jitter_s``: an exponential extra with that mean) before it runs; a
           tail delay is a large ``delay_s`` on a small ``fraction``
  error    the backend raises (the batch's items fail; committed work is retried, then reported)
  hang     the backend blocks its thread for ``delay_s`` (default 60 s); the worker gives up after the model timeout
  garbage  the backend returns malformed output (wrong length, wrong types, NaN confidence, control characters);
           :func:`check_outputs` rejects it like an error

:func:`check_outputs` runs on every batch, with or without chaos: a real backend that returns nonsense of this kind
(a broken model directory, a library bug) fails its batch instead of reaching a caption.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InvalidParameter, MalformedOutput
from ..models.base import ASRResult, OCRLine
from .keys import ModelKey
from .ports import AsrOutput, DetectInput, MtInput, TranscribeInput

KINDS = ("delay", "error", "hang", "garbage")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


@dataclass
class Fault:
    model: str = "*"
    kind: str = "delay"
    delay_s: float = 0.0
    fraction: float = 1.0
    after: int = 0  # batches that run normally before the fault starts
    jitter_s: float = 0.0  # delay only: mean of an exponential extra delay
    seen: int = 0  # batches this fault has looked at
    fired: int = 0  # batches it hit

    def matches(self, key: str) -> bool:
        return self.model == "*" or key.startswith(self.model)

    def public(self) -> dict[str, object]:
        return asdict(self)


def parse_fault(body: object) -> Fault:
    """A fault from the admin API's JSON; raises InvalidParameter with what is wrong."""
    if not isinstance(body, dict):
        raise InvalidParameter("send a JSON object {model, kind, delay_s, fraction, after}")
    # JSON types as the spec declares them (api/spec.py): "5" is not a number, 1.5 not a count, [...] not a name
    number = {"delay_s", "fraction", "jitter_s"}
    for name, value in body.items():
        if name in ("model", "kind") and not isinstance(value, str) \
                or name in number and (not isinstance(value, int | float) or isinstance(value, bool)) \
                or name == "after" and (not isinstance(value, int | float) or isinstance(value, bool)
                                        or isinstance(value, float) and not value.is_integer()):
            raise InvalidParameter(f"{name} has the wrong type: {type(value).__name__}")
    try:
        f = Fault(model=str(body.get("model", "*")), kind=str(body.get("kind", "delay")),
                  delay_s=float(body.get("delay_s", 60.0 if body.get("kind") == "hang" else 0.0)),
                  fraction=float(body.get("fraction", 1.0)), after=int(body.get("after", 0)),
                  jitter_s=float(body.get("jitter_s", 0.0)))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidParameter(f"bad fault field: {exc}") from exc
    if not all(math.isfinite(x) for x in (f.delay_s, f.fraction, f.jitter_s)) or not 0 <= f.jitter_s <= 60:
        raise InvalidParameter("delay_s, fraction and jitter_s (0-60) must be finite numbers")
    if f.kind not in KINDS:
        raise InvalidParameter(f"kind must be one of {', '.join(KINDS)}")
    if f.model not in ("*", "asr", "mt", "ocr", "tts") and ":" not in f.model:
        raise InvalidParameter("model must be asr, mt, ocr, tts, * or a full model key such as mt:en-es")
    if not (0.0 <= f.delay_s <= 600.0 and 0.0 <= f.fraction <= 1.0 and 0 <= f.after <= 10**6):
        raise InvalidParameter("delay_s must be in [0, 600], fraction in [0, 1] and after in [0, 1e6]")
    return f


def pick(faults: dict[str, Fault], key: str, rng: random.Random) -> Fault | None:
    """The fault that fires on this batch of ``key``, if any (and count it)."""
    for f in faults.values():
        if not f.matches(key):
            continue
        f.seen += 1
        if f.seen > f.after and rng.random() < f.fraction:
            f.fired += 1
            return f
    return None


def delay_of(f: Fault, rng: random.Random) -> float:
    return f.delay_s + (rng.expovariate(1.0 / f.jitter_s) if f.jitter_s > 0 else 0.0)


def garble(key: str, results: Sequence[object], rng: random.Random) -> list[object]:
    """What a broken backend might hand back instead of ``results``."""
    choice = rng.randrange(4)
    if choice == 0 or not results:
        return list(results[:-1]) if results else [None]  # one output short
    if choice == 1:
        return [None] * len(results)
    if key.startswith("asr"):
        return [AsrOutput("\x00\ufffd" * 20, float("nan"))] * len(results)
    return ["\x00\x01\ufffd" * 20] * len(results)


def _text_ok(text: object, limit: int) -> bool:
    return isinstance(text, str) and len(text) <= limit and not _CONTROL.search(text)


def check_outputs(key: ModelKey, args: list[object], results: object) -> list[object]:
    """Reject a batch whose outputs cannot be captions: raises MalformedOutput, returns the list otherwise."""
    if not isinstance(results, list) or len(results) != len(args):
        raise MalformedOutput(f"{key} returned {len(results) if isinstance(results, list) else type(results).__name__}"
                              f" outputs for {len(args)} inputs")
    for arg, r in zip(args, results, strict=True):
        if key.task == "asr" and isinstance(arg, TranscribeInput):  # a file's piece: Whisper's segments
            ok = isinstance(r, ASRResult) and _text_ok(r.text, 40 * len(arg.audio) // 16000 + 4000) and all(
                _confidence_ok(s.confidence) and math.isfinite(s.start) and s.start <= s.end
                and all(math.isfinite(w.start) and w.start <= w.end for w in s.words) for s in r.segments)
        elif isinstance(arg, DetectInput):  # each candidate's probability, nothing else
            ok = isinstance(r, dict) and set(r) == set(arg.candidates) and all(
                isinstance(p, float) and 0.0 <= p <= 1.0 for p in r.values())
        elif key.task == "asr":
            ok = isinstance(r, AsrOutput) and _text_ok(r.text, 4000) and _confidence_ok(r.confidence)
        elif key.task == "mt":
            ok = isinstance(arg, MtInput) and _text_ok(r, 10 * len(arg.text) + 200)
        elif key.task == "ocr":
            ok = isinstance(r, list) and all(isinstance(x, OCRLine) and _text_ok(x.text, 4000) for x in r)
        elif key.task == "tts":
            ok = isinstance(r, (bytes, bytearray)) and r[:4] == b"RIFF"
        else:
            ok = isinstance(r, np.ndarray) and bool(np.all(np.isfinite(r)))
        if not ok:
            raise MalformedOutput(f"{key} returned malformed output ({str(r)[:60]!r})")
    return results


def _confidence_ok(c: object) -> bool:
    return isinstance(c, (int, float)) and math.isfinite(c) and -1e-6 <= c <= 1 + 1e-6
