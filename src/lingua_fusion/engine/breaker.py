"""The SLO circuit breaker (pure: time is passed in).

Caption latencies are recorded per SLO class into fixed windows (``window_s``). At each window's end its p99 is
compared with the class target: ``k`` breached windows in a row move the class one step down the degradation
ladder (an idle window breaks the run); ``k`` healthy windows in a row (p99 under ``restore_ratio`` x target: hysteresis) move it one step back up.
Every move is returned as a Transition, so the caller can count it and tell the affected streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# what each level adds, in order; the hub and sessions apply them
STEPS = ("drop_partials", "lower_frame_rate", "skip_vision", "faster_model", "shed_low_importance")


@dataclass(frozen=True)
class Transition:
    slo: str
    at: float
    from_level: int
    to_level: int
    p99: float | None

    @property
    def step(self) -> str:
        lvl = max(self.from_level, self.to_level)
        return STEPS[lvl - 1]


@dataclass
class _ClassState:
    level: int = 0
    window_start: float = 0.0
    samples: list[float] = field(default_factory=list)
    breached_run: int = 0
    healthy_run: int = 0


class SLOBreaker:
    def __init__(self, targets: dict[str, float], *, window_s: float = 5.0, k: int = 3,
                 restore_ratio: float = 0.8, min_samples: int = 1) -> None:
        self.targets = targets
        self.window_s = window_s
        self.k = k
        self.restore_ratio = restore_ratio
        self.min_samples = min_samples
        self._state: dict[str, _ClassState] = {}

    def level(self, slo: str) -> int:
        st = self._state.get(slo)
        return st.level if st else 0

    def active(self, slo: str, step: str) -> bool:
        return self.level(slo) >= STEPS.index(step) + 1

    def record(self, slo: str, latency_s: float, now: float) -> list[Transition]:
        out = self.tick(now)
        st = self._state.setdefault(slo, _ClassState(window_start=now))
        st.samples.append(latency_s)
        return out

    def tick(self, now: float) -> list[Transition]:
        """Close every window that has ended by ``now``; return the level changes."""
        out: list[Transition] = []
        for slo, st in self._state.items():
            while now - st.window_start >= self.window_s:
                out += self._close_window(slo, st, st.window_start + self.window_s)
                st.window_start += self.window_s
        return out

    def _close_window(self, slo: str, st: _ClassState, at: float) -> list[Transition]:
        target = self.targets[slo]
        p99 = float(np.percentile(st.samples, 99)) if len(st.samples) >= self.min_samples else None
        st.samples = []
        if p99 is None:  # an idle window breaks both runs: "k windows in a row" means k windows with traffic
            st.breached_run = st.healthy_run = 0
            return []
        if p99 > target:
            st.breached_run += 1
            st.healthy_run = 0
            if st.breached_run >= self.k and st.level < len(STEPS):
                st.breached_run = 0
                st.level += 1
                return [Transition(slo, at, st.level - 1, st.level, round(p99, 3))]
        elif p99 < self.restore_ratio * target:
            st.healthy_run += 1
            st.breached_run = 0
            if st.healthy_run >= self.k and st.level > 0:
                st.healthy_run = 0
                st.level -= 1
                return [Transition(slo, at, st.level + 1, st.level, round(p99, 3))]
        else:  # between restore_ratio x target and target: hold
            st.breached_run = 0
            st.healthy_run = 0
        return []
