"""Audio (and the audio track of video) -> 16 kHz mono float32, through PyAV, with limits checked before decoding."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np

from ..config import LimitSettings
from ..errors import CorruptMedia, NoContent, TooLarge, UnsupportedMedia
from ..types import SR

TOO_SHORT_S = 0.05  # a WAV this short is judged whole or not by nothing (resampling may give no sample at all)
_WAV_SIZE_UNKNOWN = 0x7FFF0000  # streaming writers (espeak-ng, sox, pipes) write placeholder sizes this big
# Sample rates a frame may have. A 51-byte WAV declaring 1.7 GHz made swresample's set-up take 25 s and 1.8 GB
# (found by bench/fuzz_atheris.py); 1 Hz turns each input sample into 16,000.
MIN_RATE, MAX_RATE = 1_000, 768_000


def check_rate(rate: int | None, what: str) -> None:
    if not rate or not MIN_RATE <= rate <= MAX_RATE:
        raise CorruptMedia(f"{what} declares a sample rate of {rate} Hz; {MIN_RATE}-{MAX_RATE} Hz are accepted",
                           details={"sample_rate": rate})


MAX_WAV_CHUNKS = 4096  # chunks a WAV's header walk reads (real files have a handful)


def _riff_chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """A WAV's chunks after its 12-byte RIFF / WAVE header, in order: (id, offset of the chunk's 8-byte header, the
    size it declares). Nothing when ``data`` is not a WAV; the last chunk may run past the end (a cut file)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos + 4:pos + 8], "little")
        yield data[pos:pos + 4], pos, size
        pos += 8 + size + (size & 1)  # chunks are padded to an even length


def _wav_declared_seconds(data: bytes) -> float | None:
    """Duration the RIFF header promises (data chunk size / bytes per second). FFmpeg clamps a WAV's duration to
    the bytes present, so a truncated WAV would otherwise look complete. None when unknown or not a WAV. For PCM the
    bytes per second are the sample rate times the block size, as the decoder reads them (the header's own byte-rate
    field is not used by it, and a wrong one would make a whole file look cut, or a cut one whole). A file whose
    data chunk is not among its first ``MAX_WAV_CHUNKS`` chunks is not walked further (unknown: FFmpeg decides)."""
    byte_rate = 0
    for n, (cid, pos, size) in enumerate(_riff_chunks(data)):
        if n >= MAX_WAV_CHUNKS:  # a crafted file of tiny chunks: real files have a handful
            return None
        if cid == b"fmt " and size >= 16 and pos + 24 <= len(data):
            fmt = int.from_bytes(data[pos + 8:pos + 10], "little")
            rate = int.from_bytes(data[pos + 12:pos + 16], "little")
            block = int.from_bytes(data[pos + 20:pos + 22], "little")
            pcm = fmt in (1, 3, 0xFFFE)  # integer, float, extensible: fixed-size sample frames
            byte_rate = rate * block if pcm else int.from_bytes(data[pos + 16:pos + 20], "little")
        elif cid == b"data":
            if byte_rate <= 0 or size == 0 or size >= _WAV_SIZE_UNKNOWN:
                return None
            return size / byte_rate
    return None


def _one_data_chunk(data: bytes) -> bytes:
    """A WAV whose audio is split over several ``data`` chunks (legal RIFF; some recorders write one per segment)
    rewritten with one ``data`` chunk holding their bytes in order, its size the sum of their declared sizes (so a
    cut last chunk still reads as truncated). FFmpeg plays only the last data chunk of such a file (its header walk
    keeps the last one it meets): the rest of the audio was lost, or, with a short last chunk, the whole file was
    refused as truncated. Anything else (one data chunk, a placeholder size, not a WAV) is returned as it is."""
    declared, pieces = 0, 0
    spans: list[tuple[bool, int, int]] = []  # (a data chunk's audio?, start, end): offsets, not copies
    for cid, pos, size in _riff_chunks(data):
        if len(spans) >= MAX_WAV_CHUNKS:  # a crafted file of tiny chunks: walked no further, left to FFmpeg
            return data
        if cid == b"data":
            if size == 0 or size >= _WAV_SIZE_UNKNOWN:  # a streaming writer's: its audio runs to the end
                return data
            spans.append((True, pos + 8, pos + 8 + size))
            declared += size
            pieces += 1
        else:
            spans.append((False, pos, pos + 8 + size + (size & 1)))
    if pieces < 2:
        return data
    # past 2 GiB the size reads as unknown; such a file is far over max_media_seconds, refused for that anyway
    view = memoryview(data)
    out = bytearray(b"RIFF\0\0\0\0WAVE")
    for is_audio, start, end in spans:
        if not is_audio:
            out += view[start:end]
    out += b"data" + min(declared, _WAV_SIZE_UNKNOWN - 1).to_bytes(4, "little")
    for is_audio, start, end in spans:
        if is_audio:
            out += view[start:end]
    out[4:8] = (len(out) - 8).to_bytes(4, "little")
    return bytes(out)


def _av_error(exc: Exception, what: str) -> Exception:
    import av

    if isinstance(exc, av.error.DecoderNotFoundError | av.error.PatchWelcomeError):
        return UnsupportedMedia(f"unsupported codec in {what}: {exc}")
    return CorruptMedia(f"cannot decode {what}: corrupt or truncated ({type(exc).__name__})")


def decode_audio(data: bytes, limits: LimitSettings, *, what: str = "audio") -> tuple[np.ndarray, dict[str, object]]:
    """Return (samples, info). info holds container, codec, declared and decoded duration, has_video."""
    import av

    data = _one_data_chunk(data)
    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise _av_error(exc, what) from exc
    with container:
        declared = float(container.duration) / 1_000_000 if container.duration else None
        header_s = _wav_declared_seconds(data)
        if header_s is not None:  # a WAV's own header is exact; FFmpeg's estimate trusts its byte-rate field
            declared = header_s
        if declared is not None and declared > limits.max_media_seconds:
            raise TooLarge(f"{what} lasts {declared:.0f} s; the limit is {limits.max_media_seconds:.0f} s",
                           details={"limit": "max_media_seconds", "value": round(declared, 1)})
        has_video = bool(container.streams.video)
        if not container.streams.audio:
            raise NoContent(f"{what} has no audio track" + (" (video-only input needs the vision path)"
                                                            if has_video else ""))
        stream = container.streams.audio[0]
        if has_video:
            # a container's duration is its longest track: judge truncation by the audio track's own duration
            declared = (float(stream.duration * stream.time_base)
                        if stream.duration is not None and stream.time_base is not None else None)
        codec = stream.codec_context.name if stream.codec_context else "unknown"
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SR)
        chunks: list[np.ndarray] = []
        total = 0
        max_samples = int(limits.max_media_seconds * SR)
        try:
            for frame in container.decode(stream):
                check_rate(frame.sample_rate, what)
                for out in resampler.resample(frame):
                    arr = out.to_ndarray().reshape(-1)
                    chunks.append(arr)
                    total += arr.size
                if total > max_samples:
                    raise TooLarge(f"{what} is longer than {limits.max_media_seconds:.0f} s",
                                   details={"limit": "max_media_seconds"})
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
        except (av.error.FFmpegError, ValueError, OSError) as exc:
            raise _av_error(exc, what) from exc
    audio = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, dtype=np.float32)
    decoded = audio.size / SR
    # A WAV header's data size is exact, so a WAV of any length is judged by it; a container's estimate (MP3, Ogg)
    # is judged only past 1 s, where encoder padding and rounding no longer decide the ratio.
    floor = TOO_SHORT_S if header_s is not None else 1.0
    if declared and declared > floor and decoded < 0.8 * declared:
        raise CorruptMedia(f"the {what} file is truncated: its header says {declared:.2f} s of audio but only "
                           f"{decoded:.2f} s could be decoded",
                           details={"declared_s": round(declared, 2), "decoded_s": round(decoded, 2)})
    if audio.size == 0:
        if header_s is not None and 0 < header_s <= TOO_SHORT_S:  # a whole WAV of a few samples
            raise NoContent(f"the {what} file lasts {header_s * 1000:.1f} ms: too short to hold speech")
        raise CorruptMedia(f"the {what} file holds no audio that could be decoded")
    return audio, {"codec": codec, "declared_s": declared, "duration_s": decoded, "has_video": has_video}
