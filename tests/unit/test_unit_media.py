"""Unit tests for lingua_fusion.media: sniffing, image and audio decoding (pure CPU, no models)."""

from __future__ import annotations

import io
import math
import struct
import wave

import numpy as np
import pytest
from PIL import Image

from lingua_fusion.config import LimitSettings
from lingua_fusion.errors import CorruptMedia, TooLarge, UnsupportedMedia
from lingua_fusion.media import MediaKind, decode_audio, decode_image, sniff
from lingua_fusion.media.sniff import cut_in_signature


# ---- helpers -----------------------------------------------------------------------------------------------
def image_bytes(fmt: str, size: tuple[int, int] = (16, 12), noisy: bool = False) -> bytes:
    if noisy:
        rng = np.random.default_rng(0)
        img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    else:
        img = Image.new("RGB", size, (200, 30, 60))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def sine_wav(seconds: float = 1.0, rate: int = 8000, channels: int = 2, freq: float = 440.0) -> bytes:
    n = int(seconds * rate)
    frames = bytearray()
    for i in range(n):
        v = int(0.5 * 32767 * math.sin(2 * math.pi * freq * i / rate))
        frames += struct.pack("<" + "h" * channels, *([v] * channels))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(frames))
    return buf.getvalue()


# ---- sniff ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "container", "family"), [
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "wav", "audio"),
    (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "webp", "image"),
    (b"fLaC\x00\x00\x00\x22", "flac", "audio"),
    (b"OggS\x00\x02\x00\x00", "ogg", "av"),
    (b"ID3\x04\x00\x00\x00\x00\x00\x00", "mp3", "audio"),
    (b"\xff\xfb\x90\x64\x00\x00", "mp3", "audio"),  # MPEG-1 layer III frame sync
    (b"\xff\xf3\x64\xc4\x00\x00", "mp3", "audio"),  # MPEG-2 layer III frame sync
    (b"\xff\xf1\x50\x80\x02\x1f", "aac", "audio"),  # ADTS (layer bits 00) is not mp3
    (b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00", "mp4", "av"),
    (b"\x00\x00\x00\x18ftypM4A \x00\x00\x00\x00", "mp4", "av"),
    (b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01", "webm", "av"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "png", "image"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "jpeg", "image"),
    (b"GIF89a\x01\x00\x01\x00", "gif", "image"),
    (b"GIF87a\x01\x00\x01\x00", "gif", "image"),
    (b"BM\x3a\x00\x00\x00", "bmp", "image"),
    (b"II*\x00\x08\x00\x00\x00", "tiff", "image"),
    ("Hello, world! Señor, ¿qué tal? 你好\n".encode(), "text", "text"),
    (b"", "text", "text"),
    (b"\x00\x01\x02\x03\xfe\xfd\xfc\x80\x81", "unknown", "unknown"),
    (b"abc\x00def", "unknown", "unknown"),  # valid UTF-8 but has NUL -> binary
])
def test_sniff_magic_bytes(data: bytes, container: str, family: str) -> None:
    assert sniff(data) == MediaKind(container, family)


def test_sniff_real_files() -> None:
    assert sniff(sine_wav(0.05)).container == "wav"
    for fmt, name in [("PNG", "png"), ("JPEG", "jpeg"), ("WEBP", "webp"), ("GIF", "gif")]:
        assert sniff(image_bytes(fmt)) == MediaKind(name, "image")


def test_sniff_other_riff_is_unknown() -> None:
    # a RIFF that is neither WAVE nor WEBP and holds a NUL -> unknown
    assert sniff(b"RIFF\x00\x00\x00\x00AVI LIST").container == "unknown"


# ---- decode_image --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decode_image_formats(fmt: str) -> None:
    arr = decode_image(image_bytes(fmt, (16, 12)), LimitSettings())
    assert arr.shape == (12, 16, 3)
    assert arr.dtype == np.uint8
    if fmt == "PNG":  # lossless
        assert tuple(arr[5, 5]) == (200, 30, 60)


def test_decode_image_converts_to_rgb() -> None:
    buf = io.BytesIO()
    Image.new("L", (8, 8), 128).save(buf, format="PNG")
    arr = decode_image(buf.getvalue(), LimitSettings())
    assert arr.shape == (8, 8, 3)
    buf = io.BytesIO()
    Image.new("RGBA", (8, 8), (1, 2, 3, 4)).save(buf, format="PNG")
    assert decode_image(buf.getvalue(), LimitSettings()).shape == (8, 8, 3)


def test_decode_image_too_many_pixels() -> None:
    with pytest.raises(TooLarge) as ei:
        decode_image(image_bytes("PNG", (20, 20)), LimitSettings(max_image_pixels=100))
    assert ei.value.details["limit"] == "max_image_pixels"
    # exactly at the limit is fine
    assert decode_image(image_bytes("PNG", (10, 10)), LimitSettings(max_image_pixels=100)).shape == (10, 10, 3)


def test_decode_image_side_limit() -> None:
    with pytest.raises(TooLarge):
        decode_image(image_bytes("PNG", (64, 4)), LimitSettings(max_image_side=32))


def test_decode_image_truncated_png() -> None:
    data = image_bytes("PNG", (64, 64), noisy=True)
    with pytest.raises(CorruptMedia):
        decode_image(data[: len(data) // 2], LimitSettings())


def test_decode_image_garbage() -> None:
    with pytest.raises(CorruptMedia):
        decode_image(b"this is not an image at all" * 4, LimitSettings())


def test_decode_image_gif_unsupported() -> None:
    with pytest.raises(UnsupportedMedia) as ei:
        decode_image(image_bytes("GIF", (16, 16)), LimitSettings())
    assert ei.value.status == 415


def test_decode_image_too_small() -> None:
    with pytest.raises(CorruptMedia, match="too small"):
        decode_image(image_bytes("PNG", (3, 3)), LimitSettings())


# ---- decode_audio --------------------------------------------------------------------------------------------
def test_decode_audio_wav_resampled_to_16k_mono() -> None:
    audio, info = decode_audio(sine_wav(1.0, rate=8000, channels=2), LimitSettings())
    assert audio.dtype == np.float32
    assert audio.ndim == 1
    assert abs(audio.size - 16000) <= 200
    assert info["duration_s"] == pytest.approx(1.0, abs=0.02)
    assert info["declared_s"] == pytest.approx(1.0, abs=0.02)
    assert info["has_video"] is False
    assert str(info["codec"]).startswith("pcm_s16le")
    peak = float(np.abs(audio).max())
    assert 0.3 < peak <= 1.0  # the sine survives, not silence or clipped garbage


def test_decode_audio_too_long() -> None:
    with pytest.raises(TooLarge) as ei:
        decode_audio(sine_wav(1.0), LimitSettings(max_media_seconds=0.5))
    assert ei.value.details["limit"] == "max_media_seconds"


def test_decode_audio_garbage() -> None:
    with pytest.raises(CorruptMedia):
        decode_audio(b"\x00\x13garbage, definitely not audio" * 50, LimitSettings())


@pytest.mark.parametrize("rate", [1_711_292_032, 1])
def test_decode_audio_absurd_sample_rate_refused_before_resampling(rate: int) -> None:
    """Found by bench/fuzz_atheris.py: a 51-byte WAV declaring 1.7 GHz took 25 s and 1.8 GB in swresample (how fast
    it is refused now: bench/speed_bounds.py)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x01\x00" * 8)
    with pytest.raises(CorruptMedia) as ei:
        decode_audio(buf.getvalue(), LimitSettings())
    assert ei.value.details["sample_rate"] == rate


# ---- truncated WAV: refused as corrupt_media with "truncated" in the message; a streaming writer's file is not ---
def _with_data_size(wav: bytes, size: int) -> bytes:
    """The WAV with its data chunk's size field replaced (0xFFFFFFFF is what streaming recorders write)."""
    i = wav.find(b"data")
    return wav[:i + 4] + struct.pack("<I", size) + wav[i + 8:]


@pytest.mark.parametrize("seconds", [0.3, 0.8, 5.0])
def test_decode_audio_truncated_wav_of_any_length_is_corrupt(seconds: float) -> None:
    """A short WAV cut in half was decoded as if whole (the check began at 1 s), so the file API answered
    no_content ("no speech") for a damaged file. The header's data size is exact: any WAV is judged by it."""
    wav = sine_wav(seconds, rate=16000, channels=1)
    with pytest.raises(CorruptMedia, match="truncated") as ei:
        decode_audio(wav[: 44 + (len(wav) - 44) // 2], LimitSettings())
    assert ei.value.details["declared_s"] == pytest.approx(seconds, abs=0.01)
    assert ei.value.details["decoded_s"] == pytest.approx(seconds / 2, abs=0.01)


def test_decode_audio_wav_header_without_samples_says_truncated() -> None:
    wav = sine_wav(2.0, rate=16000, channels=1)
    with pytest.raises(CorruptMedia, match="truncated: its header says 2.00 s of audio but only 0.00 s"):
        decode_audio(wav[:44], LimitSettings())


@pytest.mark.parametrize("placeholder", [0xFFFFFFFF, 0])
def test_decode_audio_streaming_writer_wav_cut_short_keeps_what_is_there(placeholder: int) -> None:
    """A recorder that crashed never wrote the real size: its placeholder promises nothing, the audio present is
    the recording, and it is decoded (the file API then translates it, or says no_content if it holds no speech)."""
    wav = _with_data_size(sine_wav(2.0, rate=16000, channels=1), placeholder)
    audio, info = decode_audio(wav[: 44 + (len(wav) - 44) // 2], LimitSettings())
    assert info["duration_s"] == pytest.approx(1.0, abs=0.01) and audio.size == pytest.approx(16000, abs=160)


def test_decode_audio_streaming_writer_wav_with_no_samples_is_corrupt() -> None:
    wav = _with_data_size(sine_wav(2.0, rate=16000, channels=1), 0xFFFFFFFF)
    with pytest.raises(CorruptMedia, match="no audio"):
        decode_audio(wav[:44], LimitSettings())


def _data_chunks(wav: bytes, *cuts: int, between: bytes = b"") -> bytes:
    """``wav``'s samples split at byte offsets ``cuts`` into several ``data`` chunks, ``between`` after each but
    the last (a LIST or JUNK chunk, say)."""
    assert wav[36:40] == b"data"
    samples, edges = wav[44:], [0, *cuts, len(wav) - 44]
    chunks = [b"data" + (b - a).to_bytes(4, "little") + samples[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    body = wav[8:36] + between.join(chunks)
    return b"RIFF" + len(body).to_bytes(4, "little") + body


@pytest.mark.parametrize("cuts", [(60_000,), (2_000,), (10_000, 20_000, 50_000)])
@pytest.mark.parametrize("between", [b"", b"JUNK" + struct.pack("<I", 6) + b"\0" * 6])
def test_decode_audio_reads_every_data_chunk_in_order(cuts: tuple[int, ...], between: bytes) -> None:
    """FFmpeg plays only the last data chunk of a WAV: the rest was lost, or the file refused as truncated."""
    wav = sine_wav(2.0, rate=16000, channels=1)
    whole, _ = decode_audio(wav, LimitSettings())
    audio, info = decode_audio(_data_chunks(wav, *cuts, between=between), LimitSettings())
    assert info["declared_s"] == pytest.approx(2.0, abs=0.01) and np.array_equal(audio, whole)


def test_decode_audio_wav_in_data_chunks_cut_in_its_last_is_truncated() -> None:
    wav = _data_chunks(sine_wav(2.0, rate=16000, channels=1), 30_000)
    with pytest.raises(CorruptMedia, match="truncated: its header says 2.00 s"):
        decode_audio(wav[:-20_000], LimitSettings())


def test_a_wav_of_more_chunks_than_any_recorder_writes_is_not_walked_to_its_end() -> None:
    """A crafted upload of millions of 8-byte chunks made the chunk walk hold the GIL for seconds and take hundreds
    of MB (one object per chunk): the walk stops at MAX_WAV_CHUNKS and leaves the file to FFmpeg as it is, while a
    split file with a few chunks between its data chunks is still joined."""
    from lingua_fusion.media import audio as audio_mod

    wav = sine_wav(0.5, rate=16000, channels=1)
    junk = b"junk" + struct.pack("<I", 0)
    crafted = _data_chunks(wav, 4_000, between=junk * (audio_mod.MAX_WAV_CHUNKS + 10))
    assert audio_mod._one_data_chunk(crafted) is crafted
    few = _data_chunks(wav, 4_000, between=junk * 8)
    joined = audio_mod._one_data_chunk(few)
    assert joined.count(b"data") == 1 and joined.endswith(wav[44:]) and len(joined) == len(few) - 8
    # the duration check's walk too: a data chunk behind more junk chunks than that is not looked for (unknown)
    behind = wav[:36] + junk * (audio_mod.MAX_WAV_CHUNKS + 10) + wav[36:]
    assert audio_mod._wav_declared_seconds(behind) is None
    assert audio_mod._wav_declared_seconds(wav[:36] + junk * 8 + wav[36:]) == pytest.approx(0.5)


@pytest.mark.parametrize("n", [4, 7, 8, 11])
def test_a_riff_file_cut_inside_its_first_12_bytes_is_named_truncated(n: int) -> None:
    """sniff alone calls these text ("RIFF") or unknown; the validator refuses them as corrupt_media with this."""
    said = cut_in_signature(sine_wav(0.5)[:n])
    assert said is not None and "truncated" in said and f"after {n} bytes" in said
    assert cut_in_signature(sine_wav(0.5)[:12]) is None and cut_in_signature(b"RIF") is None
    assert cut_in_signature(b"hello world") is None


def _with_byte_rate(wav: bytes, byte_rate: int) -> bytes:
    """The WAV with its fmt chunk's byte-rate field replaced (the decoder does not read it)."""
    i = wav.find(b"fmt ") + 16
    return wav[:i] + struct.pack("<I", byte_rate) + wav[i + 4:]


@pytest.mark.parametrize("byte_rate", [1, 16000, 64000])
def test_a_wrong_byte_rate_field_neither_cuts_nor_completes_a_wav(byte_rate: int) -> None:
    """The length a WAV promises is its data size over sample rate x block size, as the decoder reads it; from the
    byte-rate field, a whole file with half the right value was refused as truncated, a file cut to 40 % with
    double the value was translated as if whole, and a value of 1 made an 85 KB file 'last 48,694 s' (an attack)."""
    whole = sine_wav(2.0, rate=16000, channels=1)  # right byte rate: 32000
    audio, info = decode_audio(_with_byte_rate(whole, byte_rate), LimitSettings())
    assert info["declared_s"] == pytest.approx(2.0) and audio.size == 32000
    with pytest.raises(CorruptMedia, match="truncated"):
        decode_audio(_with_byte_rate(whole[: 44 + int((len(whole) - 44) * 0.4)], byte_rate), LimitSettings())


def test_a_whole_wav_of_a_few_samples_is_too_short_not_truncated() -> None:
    """A complete WAV of 20 samples at 8 kHz (2.5 ms) may resample to nothing: it holds no speech (no_content),
    it is not damaged (before: 'truncated: header says 0.00 s but only 0.00 s could be decoded')."""
    from lingua_fusion.errors import NoContent

    with pytest.raises(NoContent, match="too short to hold speech"):
        decode_audio(sine_wav(20 / 8000, rate=8000, channels=1), LimitSettings())
