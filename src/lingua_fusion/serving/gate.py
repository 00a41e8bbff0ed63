"""A stream's admission (the Executor's ``admit``): the server's stream cap, then a model that owes a caption past
its stage's budget (late.py ``Owed``), then every model's measured capacity against the admitted streams' load, the
declared rates plus what streams were measured to ask beyond them (rates.py ``DemandMeter``, Scheduler.admit).

The Executor holds one ``Gate`` and tells it what it sees: committed items submitted (``submitted``), streams
released, streams re-registered after their model process restarted (``readmit``). A refusal is ``Overloaded``
(429 / 4429) naming what is full (demand.py ``no_capacity``). The clock is the Executor's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import Settings
from .demand import no_capacity
from .keys import ModelKey
from .late import Owed
from .ports import SLO_CLASSES
from .rates import SETTLE_S, DemandMeter
from .scheduler import Demand, Scheduler

if TYPE_CHECKING:
    from ..observability import Metrics


class Gate:
    def __init__(self, scheduler: Scheduler[ModelKey], settings: Settings, metrics: Metrics | None,
                 clock: Callable[[], float], *, control: bool = True) -> None:
        """``control`` False: every stream is taken (the per-stream baseline has no admission control, as
        WhisperLive and whisper_streaming have none)."""
        self.scheduler = scheduler
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.control = control
        self.owed: Owed[ModelKey] = Owed()  # a warm continuous runner's captions not yet answered
        self.meter: DemandMeter[ModelKey] = DemandMeter(clock())  # the streams' committed work, measured

    def admit(self, demand: Demand[ModelKey]) -> None:
        """Reserve capacity for a stream, or raise Overloaded (429) when admitting it would break the SLOs of the
        streams already admitted."""
        if demand.slo not in SLO_CLASSES:
            raise ValueError(demand.slo)
        if not self.control:
            self.scheduler.admitted[demand.stream_id] = demand
            return
        now = self.clock()
        at_cap = len(self.scheduler.admitted) >= self.settings.server.max_streams
        # a model owing a caption past its stage budget is behind now, whatever its measures say (late.py)
        forget = self.settings.server.model_timeout_s  # a wedged item is the runner's timeouts' to fail
        late = max(((self.owed.late(m, now, forget), m) for m in demand.rate), key=lambda lm: lm[0],
                   default=(0.0, None))
        self.measured(self.meter.due(now))  # a quiet server's measure is brought up to date first
        if at_cap or late[0] > 0 or not self.scheduler.admit(demand):
            if self.metrics is not None:
                self.metrics.streams_rejected.inc()
            full = "server.max_streams" if at_cap else str(late[1] if late[0] > 0 else self.scheduler.refused_by)
            raise no_capacity(full, len(self.scheduler.admitted), demand.slo, 0.0 if at_cap else late[0])
        self.meter.admitted(demand.stream_id, demand.rate, now)
        if self.metrics is not None:
            self.metrics.streams_admitted.inc()
            self.metrics.active_streams.set(len(self.scheduler.admitted))

    def readmit(self, demand: Demand[ModelKey]) -> None:
        """A stream admitted before this process started (its worker re-registers it): reserved, counted at once."""
        self.scheduler.admitted[demand.stream_id] = demand
        self.meter.admitted(demand.stream_id, demand.rate, self.clock() - SETTLE_S)

    def submitted(self, key: ModelKey, stream_id: str) -> None:
        """A stream's committed item for ``key`` (once per item, not per retry)."""
        self.measured(self.meter.submitted(key, stream_id, self.clock()))

    def measured(self, extra: dict[ModelKey, float] | None) -> None:
        if extra is None:
            return
        self.scheduler.demand_extra.update(extra)  # a window of the streams' committed work ended (rates.py)
        if self.metrics is not None:
            for model in extra:
                self.metrics.demand_scale.labels(model=str(model)).set(round(self.meter.scale(model), 3))

    def released(self, stream_id: str) -> None:
        self.meter.released(stream_id, self.clock())
