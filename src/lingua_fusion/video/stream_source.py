"""A video file played as a live stream's ``frame`` messages (``linguafusion stream talk.mp4``): its frames at a
sampling rate, JPEG-encoded, produced by a decoding thread into a bounded queue so that a long file never sits in
memory whole and the player takes them in media-time order beside the audio.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncGenerator

from ..config import LimitSettings
from .decode import decode_frames, probe
from .frames import VideoFrame

STREAM_FPS = 2.0  # frames sent per second of media: what the slide detector samples anyway
QUEUE = 8  # encoded frames waiting to be sent
MAX_SIDE = 960  # sent frames are at most this wide: OCR reads slides well at this size, and messages stay small


def has_video(data: bytes, limits: LimitSettings) -> bool:
    return probe(data, limits).has_video


def jpeg(frame: VideoFrame) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame.rgb).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


async def video_frames(data: bytes, limits: LimitSettings, fps: float = STREAM_FPS
                       ) -> AsyncGenerator[tuple[float, bytes], None]:
    """(media time, JPEG bytes) of the file's frames, in order. Decoding errors end the iteration by raising."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | BaseException | None] = asyncio.Queue(maxsize=QUEUE)
    stop = threading.Event()

    def put(item: tuple[float, bytes] | BaseException | None) -> None:
        fut = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
        while not stop.is_set():
            try:
                fut.result(timeout=0.5)
                return
            except TimeoutError:
                continue
        fut.cancel()

    def work() -> None:
        def on_frame(frame: VideoFrame) -> None:
            if stop.is_set():
                raise _Stopped
            put((frame.t, jpeg(frame)))

        try:
            decode_frames(data, limits, on_frame, fps=fps, max_side=MAX_SIDE)
            put(None)
        except _Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            put(exc)

    thread = threading.Thread(target=work, name="stream-frames", daemon=True)
    thread.start()
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while not queue.empty():  # unblock a put waiting for room
            queue.get_nowait()
        await asyncio.to_thread(thread.join, 5.0)


class _Stopped(Exception):
    """The reader went away: the decoding thread stops at its next frame."""
