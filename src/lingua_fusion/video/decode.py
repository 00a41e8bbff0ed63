"""A file's video track -> ``VideoFrame`` values at a sampling rate, through PyAV, with limits checked first.

Like ``media/audio.py``: the container's declared duration and the track's frame size are checked before any frame
is decoded (a 100,000 x 100,000 frame or a ten-hour file is refused from its header), and again while decoding
(a header can lie). Frames are converted to RGB only when sampled, at most ``max_side`` pixels on their longer
side: a 4K talk is read at 1280 x 720, which is what OCR reads anyway. Runs in the caller's thread: the file path
already runs off the event loop (``FileTranslator.translate`` is called through a worker thread).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..config import LimitSettings
from ..deadline import Deadline
from ..errors import CorruptMedia, TooLarge, UnsupportedMedia
from .frames import VideoFrame

MAX_DECODE_SIDE = 1280  # frames handed to consumers are at most this wide (or tall)
SKIP_NONREF_FPS = 5.0  # sampling at most this often: B-frames are skipped (they are never needed between ticks)
MAX_FPS_DECODED = 240  # a track claiming more frames per second than this is treated as corrupt input


@dataclass(frozen=True, slots=True)
class VideoProbe:
    """What a container holds, read from its header only."""

    has_audio: bool
    has_video: bool
    width: int = 0
    height: int = 0
    duration_s: float | None = None
    codec: str = ""


def _open(data: bytes):  # type: ignore[no-untyped-def]
    import av

    from ..media.audio import _av_error

    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise _av_error(exc, "video") from exc


def probe(data: bytes, limits: LimitSettings) -> VideoProbe:
    """The container's tracks, frame size and duration, checked against ``limits`` (nothing is decoded)."""
    with _open(data) as container:
        return _check(container, limits)


def _check(container, limits: LimitSettings) -> VideoProbe:  # type: ignore[no-untyped-def]
    declared = float(container.duration) / 1_000_000 if container.duration else None
    if declared is not None and declared > limits.max_media_seconds:
        raise TooLarge(f"video lasts {declared:.0f} s; the limit is {limits.max_media_seconds:.0f} s",
                       details={"limit": "max_media_seconds", "value": round(declared, 1)})
    has_audio = bool(container.streams.audio)
    if not container.streams.video:
        return VideoProbe(has_audio=has_audio, has_video=False, duration_s=declared)
    vs = container.streams.video[0]
    cc = vs.codec_context
    width, height = int(cc.width or 0), int(cc.height or 0)
    if width <= 0 or height <= 0:
        raise CorruptMedia("the video track declares no frame size", details={"width": width, "height": height})
    if max(width, height) > limits.max_image_side or width * height > limits.max_image_pixels:
        raise TooLarge(f"video frames are {width}x{height}; the limit is {limits.max_image_side} pixels a side "
                       f"and {limits.max_image_pixels} pixels a frame", details={"limit": "max_image_pixels"})
    return VideoProbe(has_audio=has_audio, has_video=True, width=width, height=height, duration_s=declared,
                      codec=cc.name or "unknown")


def scaled(width: int, height: int, max_side: int) -> tuple[int, int]:
    """(w, h) with the longer side at most ``max_side``, aspect kept, both even (what pixel formats want)."""
    scale = min(1.0, max_side / max(width, height))
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def decode_frames(data: bytes, limits: LimitSettings, on_frame: Callable[[VideoFrame], None], *, fps: float,
                  max_side: int = MAX_DECODE_SIDE, deadline: Deadline | None = None) -> tuple[VideoProbe, int]:
    """Decode the first video track, hand ``on_frame`` one RGB frame per 1/``fps`` s of media time (the first
    frame at or after each tick), in order. Returns (probe, frames decoded). Media time starts at 0 with the
    container (as the audio track's samples do), so frames and speech share one timeline."""
    import av

    from ..media.audio import _av_error

    if not 0 < fps <= 60:
        raise ValueError("fps must be in (0, 60]")
    with _open(data) as container:
        info = _check(container, limits)
        if not info.has_video:
            return info, 0
        vs = container.streams.video[0]
        vs.thread_type = "AUTO"
        if fps <= SKIP_NONREF_FPS:
            # frames no other frame refers to (B-frames) are never decoded: half the work on a typical H.264 file,
            # and still 10-15 frames a second to sample from
            vs.codec_context.skip_frame = "NONREF"
        origin = float(container.start_time) / 1_000_000 if container.start_time else 0.0
        w, h = scaled(info.width, info.height, max_side)
        period = 1.0 / fps
        next_tick = 0.0
        decoded = 0
        last_t = 0.0
        track_s = float(vs.duration * vs.time_base) if vs.duration is not None and vs.time_base is not None else None
        max_frames = int(limits.max_media_seconds * MAX_FPS_DECODED) + 1
        try:
            for frame in container.decode(vs):
                decoded += 1
                if decoded > max_frames:
                    raise CorruptMedia("the video track holds more frames than its length allows")
                t = (float(frame.time) - origin) if frame.time is not None else (decoded - 1) * period
                if not math.isfinite(t):
                    continue
                last_t = max(last_t, t)
                if t > limits.max_media_seconds:
                    raise TooLarge(f"video is longer than {limits.max_media_seconds:.0f} s",
                                   details={"limit": "max_media_seconds"})
                if t + 1e-6 < next_tick:
                    continue
                if deadline is not None:
                    deadline.check("video")
                next_tick = (math.floor(max(0.0, t) / period + 1e-6) + 1) * period
                rgb = frame.to_ndarray(format="rgb24", width=w, height=h)
                on_frame(VideoFrame(t=round(max(0.0, t), 3), rgb=rgb))
        except (av.error.FFmpegError, ValueError, OSError) as exc:
            if isinstance(exc, ValueError) and not isinstance(exc, av.error.FFmpegError):
                raise UnsupportedMedia(f"cannot convert the video frames: {exc}") from exc
            raise _av_error(exc, "video") from exc
    if track_s is not None and track_s > 2.0 and last_t < 0.8 * track_s - 1.0:
        raise CorruptMedia(f"the video track is truncated: its header says {track_s:.1f} s but frames stop at "
                           f"{last_t:.1f} s", details={"declared_s": round(track_s, 2), "decoded_s": round(last_t, 2)})
    return info, decoded
