"""Chaos: model backend faults injected into model batches (server started with ``--chaos``, set at
/v1/admin/faults), so that everything above sees them exactly as it would see a real broken backend.

A fault applies to the model keys starting with its ``model`` prefix (``asr``, ``mt``, ``ocr``, ``tts``, ``*``) and
to a ``fraction`` of the batches run after the first ``after`` ones:

  delay    the batch waits ``delay_s`` (plus ``jitter_s``: an exponential extra with that mean) before it runs; a
           tail delay is a large ``delay_s`` on a small ``fraction``. The thread is not held meanwhile
  error    the backend raises (the batch's items fail; committed work is retried, then reported)
  hang     the backend blocks its thread for ``delay_s`` (default 60 s); the model timeout gives up on it
  garbage  the backend returns malformed output (wrong length, wrong types, NaN confidence, control characters);
           the model threads' output check (serving/threads.py ``check_outputs``) rejects it like an error

``with_faults`` wraps the model threads' ``launch`` of a batch; the threads apply it only while a fault is set, so
a call with chaos off does not cross this module.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from ..errors import InjectedFault, InvalidParameter
from .keys import ModelKey
from .ports import AsrOutput

KINDS = ("delay", "error", "hang", "garbage")
RunBatch = Callable[[list[object]], Sequence[object]]  # a key's runner (serving/threads.py Runner)
# the model threads' launch of one batch on its key's thread: its future holds the checked results
Launch = Callable[[ModelKey, RunBatch, list[object]], "asyncio.Future[list[object]]"]


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


def with_faults(launch: Launch, faults: dict[str, Fault], rng: random.Random) -> Launch:
    """``launch`` with the faults in force: the fault that fires on a batch (``pick``) fails it at once, delays its
    launch (no thread held meanwhile), or wraps its runner to hang or to return garbage."""

    def start(key: ModelKey, runner: RunBatch, payloads: list[object]) -> asyncio.Future[list[object]]:
        fault = pick(faults, str(key), rng)
        if fault is None:
            return launch(key, runner, payloads)
        loop = asyncio.get_running_loop()
        if fault.kind == "error":
            failed: asyncio.Future[list[object]] = loop.create_future()
            failed.set_exception(InjectedFault(f"chaos: injected failure of {key}"))
            return failed
        if fault.kind == "delay":  # a slow answer: the thread is not held meanwhile
            out: asyncio.Future[list[object]] = loop.create_future()
            loop.call_later(delay_of(fault, rng), _launch_into, out, launch, key, runner, payloads)
            return out
        if fault.kind == "hang":
            return launch(key, functools.partial(_hung, runner, fault.delay_s), payloads)
        return launch(key, functools.partial(_garbled, runner, str(key), rng), payloads)

    return start


def _hung(runner: RunBatch, seconds: float, payloads: list[object]) -> Sequence[object]:
    time.sleep(seconds)  # a wedged backend (on the model's thread: abandoned at its timeout, then it ends)
    return runner(payloads)


def _garbled(runner: RunBatch, key: str, rng: random.Random, payloads: list[object]) -> Sequence[object]:
    return garble(key, runner(payloads), rng)


def _launch_into(out: asyncio.Future[list[object]], launch: Launch, key: ModelKey, runner: RunBatch,
                 payloads: list[object]) -> None:
    """A delayed batch launched now, its outcome handed to ``out`` (unless the caller gave up on it meanwhile)."""
    if out.done():
        return
    inner = launch(key, runner, payloads)

    def settle(done: asyncio.Future[list[object]]) -> None:
        if done.cancelled():
            if not out.done():
                out.cancel()
            return
        exc = done.exception()  # retrieved even when ``out`` is gone
        if out.done():
            return
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(done.result())

    inner.add_done_callback(settle)
    out.add_done_callback(lambda o: inner.cancel() if o.cancelled() else None)
