"""A deadline that work checks as it goes: a request's time limit enforced inside the thread doing the work
(a thread cannot be cancelled from outside; it can stop itself at the next check)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .errors import RequestTimeout


class Deadline:
    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.at = clock() + seconds

    def left(self) -> float:
        return self.at - self.clock()

    def check(self, stage: str) -> None:
        """Raise RequestTimeout (504) once the deadline has passed."""
        if self.clock() >= self.at:
            raise RequestTimeout(f"the request took longer than {self.seconds:g} s (stopped at {stage}); send less "
                                 "or retry later", details={"limit": "request_timeout_s", "stage": stage})
