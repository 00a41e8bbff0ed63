"""The SLO circuit breaker (pure: time is passed in).

Latencies are recorded per SLO class *and stage* into fixed windows (``window_s``): ``caption`` (audio end ->
caption sent, target = the class's p99 target) and the model stages (``asr``, ``mt``, ``ocr``, ``tts``: queue wait
plus run of committed work, target = the stage's share of the class target, as the scheduler budgets it). At each
window's end its p99 is compared with the target: ``k`` breached windows in a row, in any one stage, move the class
one step down the degradation ladder (an idle window breaks the run); ``k`` healthy caption windows in a row (p99
under ``restore_ratio`` x target: hysteresis) while no stage is breaching move it one step back up. Every move is
returned as a Transition (with the stage that caused it), so the caller can count it and tell the affected streams.
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
    stage: str = "caption"

    @property
    def step(self) -> str:
        lvl = max(self.from_level, self.to_level)
        return STEPS[lvl - 1]


@dataclass
class _Window:
    start: float = 0.0
    samples: list[float] = field(default_factory=list)
    breached_run: int = 0
    healthy_run: int = 0


class SLOBreaker:
    def __init__(self, targets: dict[str, float], *, window_s: float = 5.0, k: int = 3,
                 restore_ratio: float = 0.8, min_samples: int = 1,
                 stage_share: dict[str, float] | None = None, quiet_s: float = 60.0) -> None:
        """``quiet_s``: a degraded class with no window of traffic for this long (and at least two windows) is
        restored (``tick``)."""
        self.targets = targets
        self.quiet_s = max(quiet_s, 2 * window_s)
        self.window_s = window_s
        self.k = k
        self.restore_ratio = restore_ratio
        self.min_samples = min_samples
        self.stage_share = {"caption": 1.0, **(stage_share or {})}
        self._level: dict[str, int] = {}
        self._windows: dict[tuple[str, str], _Window] = {}
        self._traffic: dict[str, float] = {}  # per class: the end of its last window that had samples

    def level(self, slo: str) -> int:
        return self._level.get(slo, 0)

    def active(self, slo: str, step: str) -> bool:
        return self.level(slo) >= STEPS.index(step) + 1

    def target(self, slo: str, stage: str) -> float:
        return self.targets[slo] * self.stage_share.get(stage, 1.0)

    def record(self, slo: str, latency_s: float, now: float, stage: str = "caption") -> list[Transition]:
        out = self.tick(now)
        w = self._windows.setdefault((slo, stage), _Window(start=now))
        w.samples.append(latency_s)
        return out

    def tick(self, now: float) -> list[Transition]:
        """Close every window that has ended by ``now``; return the level changes."""
        out: list[Transition] = []
        for (slo, stage), w in list(self._windows.items()):
            while now - w.start >= self.window_s:
                out += self._close_window(slo, stage, w, w.start + self.window_s)
                w.start += self.window_s
        for slo, level in list(self._level.items()):
            # a class gone quiet (no window with samples for ``quiet_s``: its streams ended, or were shed or
            # refused) is restored: with nothing left to measure it would otherwise stay degraded for good,
            # refusing its new streams and showing a level no traffic backs
            if level and now - self._traffic.get(slo, now) > self.quiet_s:
                self._reset_runs(slo)
                self._level[slo] = 0
                out.append(Transition(slo, now, level, 0, None, "caption"))
        return out

    def restore(self, now: float) -> list[Transition]:
        """An operator's reset (``DELETE /v1/admin/breaker``): every degraded class back to level 0, its windows
        counted afresh; a benchmark sweep starts each row from a server that is not still refusing the last one."""
        out: list[Transition] = []
        for slo, level in list(self._level.items()):
            self._reset_runs(slo)
            if level:
                self._level[slo] = 0
                out.append(Transition(slo, now, level, 0, None, "caption"))
        for w in self._windows.values():
            w.samples = []
            w.start = now
        return out

    def _close_window(self, slo: str, stage: str, w: _Window, at: float) -> list[Transition]:
        target = self.target(slo, stage)
        p99 = float(np.percentile(w.samples, 99)) if len(w.samples) >= self.min_samples else None
        w.samples = []
        if p99 is None:  # an idle window breaks both runs: "k windows in a row" means k windows with traffic
            w.breached_run = w.healthy_run = 0
            return []
        self._traffic[slo] = max(self._traffic.get(slo, at), at)
        level = self.level(slo)
        if p99 > target:
            w.breached_run += 1
            w.healthy_run = 0
            if w.breached_run >= self.k and level < len(STEPS):
                self._reset_runs(slo)
                self._level[slo] = level + 1
                return [Transition(slo, at, level, level + 1, round(p99, 3), stage)]
        elif p99 < self.restore_ratio * target:
            w.healthy_run += 1
            w.breached_run = 0
            breaching = any(x.breached_run for (c, _s), x in self._windows.items() if c == slo)
            if stage == "caption" and w.healthy_run >= self.k and level > 0 and not breaching:
                self._reset_runs(slo)
                self._level[slo] = level - 1
                return [Transition(slo, at, level, level - 1, round(p99, 3), stage)]
        else:  # between restore_ratio x target and target: hold
            w.breached_run = 0
            w.healthy_run = 0
        return []

    def _reset_runs(self, slo: str) -> None:
        """After a move, every stage of the class counts its K windows afresh."""
        for (c, _s), x in self._windows.items():
            if c == slo:
                x.breached_run = x.healthy_run = 0
