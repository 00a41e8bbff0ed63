"""A crashed pytest-xdist worker must cost its own test, never the whole run.

pytest-xdist 3.8.0 replaces a crashed worker, but under ``--dist loadfile`` its scheduler then puts the crashed
worker's whole work back in the queue, finished tests included: the crashing test runs again (and crashes again),
and a file whose tests had all finished is sent as an empty batch, which the new worker waits on for ever (its
issues #784, #1323 and #1327; fixed upstream after 3.8.0). ``remove_node`` below requeues only what had not run, with
the crashed test counted as done (xdist reports it failed: "worker 'gw0' crashed while running ..."). When two workers
crash, one replacement can finish collecting while the other has not: xdist then hands work to the one that has no
collection yet and stops with an internal KeyError; ``_reschedule`` below waits for a node's collection instead (the
node is scheduled when its own collection arrives). Any other
xdist version keeps its own scheduler and gets ``--max-worker-restart 0`` instead: a crash then ends the run, which
fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

PATCHED_VERSION = "3.8.0"


def remove_node(self: Any, node: Any) -> str | None:  # LoadScopeScheduling.remove_node (xdist's own types)
    workload: dict[str, dict[str, bool]] = self.assigned_work.pop(node)
    pending = [(scope, nodeid) for scope, unit in workload.items() for nodeid, done in unit.items() if not done]
    if not pending:
        return None
    scope, crashed = pending[0]  # a worker runs its batch in order: the first test not done is the one it died in
    workload[scope][crashed] = True
    for scope, unit in workload.items():
        if not all(unit.values()):
            self.workqueue[scope] = unit
    for other in self.assigned_work:
        self._reschedule(other)
    return crashed


def waits_for_collection(reschedule: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """LoadScopeScheduling._reschedule that leaves a node alone until its collection has arrived."""
    def _reschedule(self: Any, node: Any) -> None:
        if node in self.registered_collections:
            reschedule(self, node)
    _reschedule.unguarded = reschedule  # type: ignore[attr-defined]
    return _reschedule


def install(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or getattr(config.option, "maxworkerrestart", "absent") == "absent":
        return  # an xdist worker, or no xdist at all
    import xdist
    from xdist.scheduler.loadscope import LoadScopeScheduling

    if xdist.__version__ == PATCHED_VERSION:
        LoadScopeScheduling.remove_node = remove_node  # type: ignore[method-assign]
        if not hasattr(LoadScopeScheduling._reschedule, "unguarded"):
            LoadScopeScheduling._reschedule = waits_for_collection(  # type: ignore[method-assign]
                LoadScopeScheduling._reschedule)
    elif config.option.maxworkerrestart is None:
        config.option.maxworkerrestart = "0"
