"""A stream whose commit jobs pile up (the server captions slower than the input comes) is closed as
``overloaded``, not ``slow_consumer``: that code tells a client it stopped reading its events (docs/streaming.md),
and a room publisher that read every event promptly was told so (found by sending long texts into a room)."""

from __future__ import annotations

import asyncio
from typing import Any

from lingua_fusion.errors import LinguaFusionError
from lingua_fusion.stream.finals import Finals


def test_a_full_backlog_of_commit_jobs_is_overloaded_not_slow_consumer() -> None:
    async def scenario() -> list[LinguaFusionError]:
        failures: list[LinguaFusionError] = []
        tasks: list[asyncio.Task[Any]] = []

        def spawn(coro: Any, name: str) -> asyncio.Task[Any]:
            tasks.append(asyncio.ensure_future(coro))
            return tasks[-1]

        finals = Finals(spec=None, jobs=None, journal=None, timeline=None,  # type: ignore[arg-type]
                        caption_done=lambda s: None, fail=failures.append, emit=lambda e: None, spawn=spawn)
        never = asyncio.Event()

        async def slow_commit() -> None:
            await never.wait()  # the translation that has not finished

        for _ in range(finals.pending.maxsize + 1):
            finals.queue(slow_commit())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return failures

    failures = asyncio.run(scenario())
    assert [f.code for f in failures] == ["overloaded"]
    assert failures[0].retryable
