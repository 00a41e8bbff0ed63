"""stream/images.py: a stream's vocabulary that cannot be attached on its first frame (its store down, or the
vocabulary gone) costs a notice, never the stream: slides go on, and a store that answers again is tried again
(review finding: the error escaped the reader and closed the stream)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import render_slide

from lingua_fusion.config import Settings
from lingua_fusion.errors import NotFound, StoreUnavailable
from lingua_fusion.stream.budget import pixel_budget
from lingua_fusion.stream.events import Error
from lingua_fusion.stream.images import ATTACH_RETRY_S, Images

pytestmark = pytest.mark.timeout(30)


class Video:
    def __init__(self) -> None:
        self.frames: list[float] = []

    async def feed(self, data: bytes, t: float) -> None:
        self.frames.append(t)


def images(attach: Any, events: list[Any]) -> Images:
    settings = Settings()
    return Images(None, settings, None, lambda _m, ts: float(ts or 0.0), lambda _step: False,  # type: ignore[arg-type]
                  Video, attach, events.append, None,  # type: ignore[arg-type]
                  pixel_budget(settings.limits, time.monotonic))


async def test_a_store_down_pauses_signs_once_and_they_attach_when_it_answers() -> None:
    failures = [StoreUnavailable("redis down", store="the vocabulary store")] * 2
    attached: list[Any] = []

    async def attach(video: Any) -> None:
        if failures:
            raise failures.pop()
        attached.append(video)

    events: list[Any] = []
    im = images(attach, events)
    frame = render_slide(["Agenda"])
    for t in (0.0, 1.0, ATTACH_RETRY_S, ATTACH_RETRY_S + 1, 2 * ATTACH_RETRY_S):
        await im.feed_frame(frame, t)
    assert im.video.frames == [0.0, 1.0, ATTACH_RETRY_S, ATTACH_RETRY_S + 1, 2 * ATTACH_RETRY_S]  # slides went on
    assert attached == [im.video]  # tried at 0 and 5 (both down), attached at 10
    errors = [e for e in events if isinstance(e, Error)]
    assert len(errors) == 1 and errors[0].code == "state_store_unavailable"


async def test_a_vocabulary_gone_since_the_open_turns_signs_off_and_the_stream_goes_on() -> None:
    tries: list[float] = []

    async def attach(video: Any) -> None:
        tries.append(1)
        raise NotFound("no vocabulary vo_1 for this key")

    events: list[Any] = []
    im = images(attach, events)
    frame = render_slide(["Agenda"])
    for t in (0.0, 10.0, 20.0):
        await im.feed_frame(frame, t)
    assert len(tries) == 1 and im.video.frames == [0.0, 10.0, 20.0]
    assert [e.code for e in events if isinstance(e, Error)] == ["not_found"]
