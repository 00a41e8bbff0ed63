"""The SLO breakers' reactions to live streams: every caption's latency and every committed model stage's are
recorded (per class and per key, stream/tenant_breaker.py), windows that ended are closed once a second, and each
move is applied: logged and counted, each stream whose working level changed told once (``degraded`` /
``restored``), the least important stream shed at the shedding step, and a new stream of a class (or key) that is
missing its target refused.

Wiring: whoever builds the engine makes the ``BreakerSupervisor`` first, gives it to the engine's constructor as its
``StageObserver`` (``observer=``: the engine reports each committed item's stage latency to ``stage_done``) and to
the ``StreamService`` (``supervisor=``), which binds it to its live streams and its engine's clock once
(``watch``). Captions reach it through the service (``record``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Settings
from ..errors import Overloaded
from ..serving.ports import SLO_CLASSES, STAGE_BUDGET
from .breaker import STEPS, SLOBreaker, Transition
from .events import Degraded, Restored
from .session import StreamSession
from .tenant_breaker import KeyedTransition, TenantBreaker

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.streams")


RESET_MARKER = "breaker-reset"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _no_streams() -> Iterable[StreamSession]:
    return ()


class BreakerSupervisor:
    """Implements ``StageObserver`` (serving/ports.py): made before the engine, which is given it at construction."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        server = settings.server
        self.breaker = TenantBreaker(lambda: SLOBreaker(dict(SLO_CLASSES), window_s=server.breaker_window_s,
                                                        k=server.breaker_k, stage_share=STAGE_BUDGET))
        self.clock: Callable[[], float] = time.monotonic  # the engine's, once watched
        self.sessions: Callable[[], Iterable[StreamSession]] = _no_streams  # the service's live streams, once watched
        self._watched = False
        self.metrics = metrics
        self.levels: dict[str, int] = {}  # stream id -> the level it was last told
        self._ticker: asyncio.Task[None] | None = None
        # an admin's reset reaches every worker of ``serve --workers N`` (each has its own breakers): the route
        # touches this file in the state directory, and each worker's tick restores its breakers when it changes
        self.reset_marker = settings.resolved_state_dir() / RESET_MARKER
        self._reset_seen = _mtime(self.reset_marker)

    def watch(self, clock: Callable[[], float], sessions: Callable[[], Iterable[StreamSession]]) -> None:
        """Serve one StreamService (its constructor calls this, once): ``sessions`` are its live streams, read when a
        move is applied (told, shed); ``clock`` is its engine's, which times the breakers' windows."""
        if self._watched:
            raise RuntimeError("this BreakerSupervisor serves a StreamService already: make one per service")
        self._watched = True
        self.clock, self.sessions = clock, sessions

    # ---- StageObserver -----------------------------------------------------------------------------------------
    def stage_done(self, slo: str, stage: str, seconds: float, key_id: str = "") -> None:
        """A committed model item's stage latency, from the engine this supervisor was given to."""
        self.record(slo, seconds, stage, key_id)  # file work is not recorded (FILE_CLASS)

    def record(self, slo: str, seconds: float, stage: str, key_id: str) -> None:
        if slo not in SLO_CLASSES:  # file work (serving/ports.py FILE_CLASS) trips no stream breaker
            return
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick_loop(), name="breaker")
        self._apply(self.breaker.record(slo, seconds, self.clock(), stage, key_id or None))

    def degraded(self, slo: str, step: str, key_id: str = "") -> bool:
        return self.breaker.active(slo, step, key_id)

    def refuse_if_breached(self, slo: str, key_id: str, refused: Callable[[], None]) -> None:
        """A new stream of a class whose SLO breaker has moved down is refused: the streams of that class already
        miss its latency target, whatever the cause admission's cost model cannot see (the continuous engine, whose
        cost it does not model; a slow dependency; another tenant of the machine). A resume is not refused for it:
        it carries a stream the server already serves. A class that has gone quiet is restored by the breaker itself
        (``SLOBreaker.tick``), so it is not locked out. Per key: a key whose own streams miss the target is refused;
        another key, meeting it, is not refused for that key's doing."""
        self._restore_if_announced()  # an admin's reset through another worker counts at once
        self._apply(self.breaker.tick(self.clock()))  # windows that ended since the last caption
        level = self.breaker.refusing(slo, key_id)
        if level:
            refused()
            own = self.breaker.key_level(slo, key_id) > 0
            whose = "this key's streams" if own else "streams"
            raise Overloaded(f"{whose} of the {slo} class are missing its latency target now; retry later or use a "
                             "looser SLO class", retry_after=5.0,
                             details={"slo": slo, "breaker_level": level, "scope": "key" if own else "class"})

    def restore(self) -> dict[str, int]:
        """An operator's reset of every breaker; the streams it had degraded are told ``restored``. Returns the
        classes' levels after it (all 0)."""
        self._apply(self.breaker.restore(self.clock()))
        return self.levels_by_class()

    def announce_restore(self) -> None:
        """Tell this server's other workers (blocking file I/O: offloaded by the caller)."""
        self.reset_marker.parent.mkdir(parents=True, exist_ok=True)
        self.reset_marker.write_text(f"{time.time():.6f}\n")
        self._reset_seen = _mtime(self.reset_marker)

    def _restore_if_announced(self) -> None:
        seen = _mtime(self.reset_marker)  # one stat a second
        if seen != self._reset_seen:
            self._reset_seen = seen
            log.warning("SLO breakers restored by an admin (another worker's DELETE /v1/admin/breaker)")
            self.restore()

    def levels_by_class(self) -> dict[str, int]:
        return {slo: self.breaker.level(slo) for slo in SLO_CLASSES}

    def forget(self, stream_id: str) -> None:
        self.levels.pop(stream_id, None)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._ticker

    async def _tick_loop(self) -> None:
        """Closes idle windows (a class that went quiet is restored)."""
        while True:
            await asyncio.sleep(1.0)
            self._restore_if_announced()
            self._apply(self.breaker.tick(self.clock()))

    def _apply(self, transitions: list[KeyedTransition]) -> None:
        """Log and count the breakers' moves, then tell each stream whose working level (``TenantBreaker.effective``)
        changed, once, whichever breaker moved it; a stream reaching the shedding step may be shed."""
        if not transitions:
            return
        last: dict[str, Transition] = {}  # per class: the latest move, for what the notice says
        for kt in transitions:
            t, key_id = kt.move, kt.key_id
            down = t.to_level > t.from_level
            whose = f"key {key_id}" if key_id else "class"
            log.warning("SLO breaker %s (%s): level %d -> %d (%s, %s window p99 %s s)", t.slo, whose, t.from_level,
                        t.to_level, t.step, t.stage, t.p99)
            if self.metrics is not None and key_id is None:
                self.metrics.degradation_level.labels(slo=t.slo).set(t.to_level)
                self.metrics.breaker_transitions.labels(slo=t.slo, direction="degrade" if down else "restore").inc()
            last[t.slo] = t
        for slo, t in last.items():
            shed: list[StreamSession] = []
            for s in [s for s in self.sessions() if s.spec.slo == slo]:
                before = self.levels.get(s.spec.stream_id, 0)
                now = self.breaker.effective(slo, s.spec.key_id)
                if now == before:
                    continue
                self.levels[s.spec.stream_id] = now
                notice = Degraded if now > before else Restored
                step = STEPS[max(now, before) - 1]
                s.notify(notice(slo=slo, level=now, step=step, stage=t.stage, window_p99_s=t.p99))
                if now > before and step == "shed_low_importance":
                    shed.append(s)
            if shed:
                victim = min(shed, key=lambda s: s.spec.importance)
                victim.fail(Overloaded("the server is over its SLO; the least important stream was shed",
                                       retry_after=10.0))
