"""A crashed pytest-xdist worker must cost its own test, never the whole run.

pytest-xdist 3.8.0 replaces a crashed worker, but under ``--dist loadfile`` its scheduler then puts the crashed
worker's whole work back in the queue, finished tests included: the crashing test runs again (and crashes again),
and a file whose tests had all finished is sent as an empty batch, which the new worker waits on for ever (its
issues #784, #1323 and #1327; fixed upstream after 3.8.0). ``remove_node`` below requeues only what had not run, with
the crashed test counted as done (xdist reports it failed: "worker 'gw0' crashed while running ..."). Any other
xdist version keeps its own scheduler and gets ``--max-worker-restart 0`` instead: a crash then ends the run, which
fails.
"""

from __future__ import annotations

from typing import Any

import pytest

PATCHED_VERSION = "3.8.0"


def _remove_node(self: Any, node: Any) -> str | None:  # LoadScopeScheduling.remove_node (xdist's own types)
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


def install(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or getattr(config.option, "maxworkerrestart", "absent") == "absent":
        return  # an xdist worker, or no xdist at all
    import xdist
    from xdist.scheduler.loadscope import LoadScopeScheduling

    if xdist.__version__ == PATCHED_VERSION:
        LoadScopeScheduling.remove_node = _remove_node  # type: ignore[method-assign]
    elif config.option.maxworkerrestart is None:
        config.option.maxworkerrestart = "0"
