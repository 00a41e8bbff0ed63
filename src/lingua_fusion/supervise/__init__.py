"""Supervised worker processes for native code the server must survive (policy.py, process.py, wire.py)."""

from .policy import RestartPolicy, WorkerState
from .process import WorkerHealth, WorkerProcess

__all__ = ["RestartPolicy", "WorkerHealth", "WorkerProcess", "WorkerState"]
