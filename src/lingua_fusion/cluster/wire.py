"""What crosses the Ray hop between a gateway and a model replica: one ``Call`` in, one ``Reply`` out. Pure.

A gateway's clock and a replica's clock are different machines' clocks in a real cluster, so a call carries the
caption's *age* (seconds since its clock started), never a timestamp; the replica rebuilds ``start`` on its own
clock. A traced call carries its gateway client span as a W3C ``traceparent`` string (None with tracing off): the
replica records the item's batch span under it. Errors come back as a code and a message and are rebuilt as the
same typed error (``errors.from_code``): never a pickled exception, whose class a gateway on another version might
not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import LinguaFusionError, Overloaded, from_code
from ..serving.keys import ModelKey
from ..serving.ports import CallContext

if TYPE_CHECKING:
    from ..tracing import TraceRef


@dataclass(frozen=True)
class Call:
    key: str  # ModelKey's string form
    payload: object  # the port's payload (serving/ports.py), pickled by Ray across the hop
    stream_id: str
    slo: str
    importance: float
    tentative: bool
    age_s: float | None  # seconds since the caption's clock started; None: it starts on arrival
    key_id: str
    traceparent: str | None = None  # the gateway's client span of this call (tracing on)

    @classmethod
    def make(cls, key: ModelKey, payload: object, ctx: CallContext, now: float,
             traceparent: str | None = None) -> Call:
        age = None if ctx.start is None else max(0.0, now - ctx.start)
        return cls(str(key), payload, ctx.stream_id, ctx.slo, ctx.importance, ctx.tentative, age, ctx.key_id,
                   traceparent)

    def context(self, now: float, trace: TraceRef | None = None) -> CallContext:
        """The call's context on the replica's clock ``now``; ``trace``: the replica's view of ``traceparent``."""
        start = None if self.age_s is None else now - self.age_s
        return CallContext(self.stream_id, self.slo, self.importance, self.tentative, start, self.key_id, trace)

    def model_key(self) -> ModelKey:
        return ModelKey.parse(self.key)


@dataclass(frozen=True)
class Reply:
    value: object = None  # the port's result for the call's payload
    code: str | None = None  # set: the call failed with this error code
    message: str = ""
    retry_after: float | None = None
    depth: int = 0  # the key's queue on the replica after this call (a stream's ``metrics`` event shows it)

    @classmethod
    def ok(cls, value: object, depth: int) -> Reply:
        return cls(value=value, depth=depth)

    @classmethod
    def failed(cls, exc: LinguaFusionError, depth: int) -> Reply:
        retry_after = exc.retry_after if isinstance(exc, Overloaded) else None
        return cls(code=exc.code, message=exc.message, retry_after=retry_after, depth=depth)

    def result(self) -> object:
        """The value, or the typed error raised again on the gateway."""
        if self.code is not None:
            raise from_code(self.code, self.message, retry_after=self.retry_after)
        return self.value
