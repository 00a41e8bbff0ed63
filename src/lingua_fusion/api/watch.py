"""A check each process makes of the shared stores every few seconds (``revocation.py``: keys revoked elsewhere;
``takeover.py``: streams resumed elsewhere), run until the server stops.

``every`` runs ``check`` every ``interval_s``; a failed look is logged once per run of failures (not every second
of a store outage; with its traceback when it is not the store's own failure) and the next one is tried: ended, the
watch would stop acting in this process until a restart, and nobody would know.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable

from ..errors import LinguaFusionError

log = logging.getLogger("lingua_fusion.api")
STORE_FAILURES = (TimeoutError, sqlite3.Error, LinguaFusionError)  # a store that is locked, slow or down


async def every(interval_s: float, check: Callable[[], Awaitable[int]], what: str, acted: str) -> None:
    """``check()`` every ``interval_s`` until cancelled. ``what`` names the check in a failure's log line;
    ``acted`` (with ``{n}``) is logged when a look acted on ``n`` streams."""
    failing = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            n = await check()
        except STORE_FAILURES as exc:
            if not failing:
                log.warning("%s failed (logged again after it next succeeds): %r", what, exc)
            failing = True
            continue
        except Exception:  # noqa: BLE001 - a bug: its traceback once; the watch goes on
            if not failing:
                log.exception("%s failed (logged again after it next succeeds)", what)
            failing = True
            continue
        failing = False
        if n:
            log.info(acted.format(n=n))
