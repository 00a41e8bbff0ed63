"""A stream's pictures: ``image`` messages (each decoded off the loop and read by OCR into a ``slide`` event) and
``frame`` messages (a video, through the slide change detector: stream/video.py). While the stream's SLO
class is degraded frames are thinned (``lower_frame_rate``) or not read (``skip_vision``); decoded images in flight
are bounded per stream and, through ``Slots``, across the service's streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from ..config import Settings
from ..errors import BackendError, ClientError, InvalidParameter, Overloaded
from ..tracing import TraceRef, span
from .budget import PixelBudget, pay
from .contracts import Degraded, Emit, Slots, Spawn
from .events import Error, Slide
from .jobs import StreamJobs

if TYPE_CHECKING:
    from .video import StreamVideo

LOW_FRAME_INTERVAL_S = 5.0  # breaker step "lower_frame_rate": image frames read at most this often per stream
MAX_IMAGES_IN_FLIGHT = 2  # frames a stream may have decoding or waiting for OCR at once; more are refused
ATTACH_RETRY_S = 5.0  # a vocabulary whose store did not answer is tried again this much later (stream time)


class Images:
    def __init__(self, jobs: StreamJobs, settings: Settings, slots: Slots, place: Callable[[str, float | None], float],
                 degraded: Degraded, new_video: Callable[[], StreamVideo],
                 attach: Callable[[StreamVideo], Awaitable[None]], emit: Emit,
                 spawn: Spawn, pixels: PixelBudget, trace: TraceRef | None = None) -> None:
        self.jobs = jobs
        self.settings = settings
        self.slots = slots  # the same bound, across the service's streams
        self._place = place  # (modality, media ts) -> stream time
        self._degraded = degraded
        self._new_video = new_video  # a StreamVideo for the first ``frame`` message
        self._attach = attach  # and the stream's vocabulary consumers on it
        self._emit = emit
        self._spawn = spawn
        self.pixels = pixels  # the key's, shared by its streams (stream/budget.py)
        self.trace = trace
        self.frames_dropped = 0  # image frames not read because the class was degraded
        self.video: StreamVideo | None = None  # made by the first ``frame`` message
        self._last_frame_t = -1e9
        self._last_video_t = -1e9
        self._in_flight = 0  # frames decoding or waiting for OCR
        self._attach_at: float | None = None  # stream time of the next try at attaching the vocabulary; None: done
        self._attach_notified = False

    def _thinned(self, t: float, last_t: float) -> bool:
        """Degraded to ``lower_frame_rate``: at most one frame read per LOW_FRAME_INTERVAL_S of stream time."""
        if self._degraded("lower_frame_rate") and t - last_t < LOW_FRAME_INTERVAL_S:
            self.frames_dropped += 1
            return True
        return False

    def _skipped(self) -> bool:
        """Degraded to ``skip_vision``: pictures are not read while the class is over its SLO."""
        if self._degraded("skip_vision"):
            self.frames_dropped += 1
            return True
        return False

    async def _pay(self, data: bytes) -> None:
        """The picture's pixels, from its header (off the loop), paid from the key's budget before it is decoded:
        a key sending pictures faster than the budget has this stream's reads wait."""
        from ..media.image import image_pixels

        pixels = min(await asyncio.to_thread(image_pixels, data), self.settings.limits.max_image_pixels)
        await pay(self.pixels, pixels, self._emit)

    async def feed_image(self, data: bytes, ts: float | None) -> None:
        from ..media import decode_image

        if self._skipped():
            return
        t = self._place("image", ts)
        if self._thinned(t, self._last_frame_t):
            return
        await self._pay(data)
        if self._in_flight >= MAX_IMAGES_IN_FLIGHT:
            raise Overloaded(f"more than {MAX_IMAGES_IN_FLIGHT} images of this stream are being read; send fewer",
                             retry_after=1.0)
        if not self.slots.take(self.jobs.spec.key_id):
            raise Overloaded("the server is reading too many images (of this key, or of all); send fewer",
                             retry_after=1.0)
        self._in_flight += 1
        try:
            with span(self.trace, "decode", media="image", bytes=len(data)):
                image = await asyncio.to_thread(decode_image, data, self.settings.limits)  # big images: off the loop
        except BaseException:
            self._image_done()
            raise
        self._last_frame_t = t
        # released when the job ends, however it ends (a task cancelled before it starts never runs a finally)
        self._spawn(self._slide_job(image, t), "ocr").add_done_callback(lambda _task: self._image_done())

    async def feed_frame(self, data: bytes, ts: float | None) -> None:
        """One video frame (png / jpeg / webp) at media time ``ts``: every frame goes through the slide change
        detector, OCR and MT run only when the picture changed (stream/video.py)."""
        if ts is None:
            raise InvalidParameter("a frame message needs its media timestamp ts: change detection runs on time")
        if self._skipped():
            return
        t = self._place("image", ts)  # a camera's clock: the image clock offset applies
        if self._thinned(t, self._last_video_t):
            return
        await self._pay(data)
        if self.video is None:
            self.video = self._new_video()
            self._attach_at = t
        if self._attach_at is not None and t >= self._attach_at:
            await self._attach_vocabulary(self.video, t)
        self._last_video_t = t
        await self.video.feed(data, t)

    async def _attach_vocabulary(self, video: StreamVideo, t: float) -> None:
        """The stream's vocabulary consumers on its video. Its store unavailable (Redis down): slides go on, signs
        wait and are tried again ATTACH_RETRY_S of stream time later (one notice); the vocabulary gone since the
        stream opened (another key's now, deleted): no signs for this stream, said once. Never the stream's end."""
        try:
            await self._attach(video)
            self._attach_at = None
        except BackendError as exc:
            self._attach_at = t + ATTACH_RETRY_S
            if not self._attach_notified:
                self._attach_notified = True
                self._emit(Error(exc.code, f"signs paused, slides go on: {exc.public_message}"))
        except ClientError as exc:
            self._attach_at = None
            self._emit(Error(exc.code, f"signs off for this stream: {exc.message}"))

    def _image_done(self) -> None:
        self._in_flight -= 1
        self.slots.give(self.jobs.spec.key_id)

    async def _slide_job(self, image: np.ndarray, t: float) -> None:
        try:
            text = await self.jobs.read_slide(image, t)
        except BackendError as exc:
            self._emit(Error(exc.code, f"slide not read: {exc.public_message}"))
            return
        if text:
            self._emit(Slide(t=round(t, 3), source_text=text))
