"""Identify a container from its first bytes (never from the file name or the declared content type)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaKind:
    container: str  # wav, flac, ogg, mp3, aac, mp4, webm, png, jpeg, webp, gif, bmp, tiff, text, unknown
    family: str  # audio | av (audio and/or video) | image | text | unknown


def sniff(data: bytes) -> MediaKind:
    h = data[:64]
    if h.startswith(b"RIFF") and h[8:12] == b"WAVE":
        return MediaKind("wav", "audio")
    if h.startswith(b"RIFF") and h[8:12] == b"WEBP":
        return MediaKind("webp", "image")
    if h.startswith(b"fLaC"):
        return MediaKind("flac", "audio")
    if h.startswith(b"OggS"):
        return MediaKind("ogg", "av")
    if h.startswith(b"ID3") or (len(h) > 1 and h[0] == 0xFF and (h[1] & 0xE0) == 0xE0 and (h[1] & 0x06) != 0):
        return MediaKind("mp3", "audio")
    if len(h) > 1 and h[0] == 0xFF and (h[1] & 0xF6) == 0xF0:
        return MediaKind("aac", "audio")
    if h[4:8] == b"ftyp":
        return MediaKind("mp4", "av")
    if h.startswith(b"\x1a\x45\xdf\xa3"):
        return MediaKind("webm", "av")
    if h.startswith(b"\x89PNG\r\n\x1a\n"):
        return MediaKind("png", "image")
    if h.startswith(b"\xff\xd8\xff"):
        return MediaKind("jpeg", "image")
    if h.startswith((b"GIF87a", b"GIF89a")):
        return MediaKind("gif", "image")
    if h.startswith(b"BM"):
        return MediaKind("bmp", "image")
    if h.startswith((b"II*\x00", b"MM\x00*")):
        return MediaKind("tiff", "image")
    try:
        data[:4096].decode("utf-8")
        if b"\x00" not in data[:4096]:
            return MediaKind("text", "text")
    except UnicodeDecodeError:
        pass
    return MediaKind("unknown", "unknown")


def cut_in_signature(data: bytes) -> str | None:
    """A sentence when the bytes stop inside a RIFF container's first 12 bytes (the form type, WAVE or WEBP, is
    missing): such a file is damaged, not of an unknown kind, and ``sniff`` alone would call it text or unknown."""
    if data.startswith(b"RIFF") and len(data) < 12:
        return (f"the file is truncated: it stops after {len(data)} bytes, inside its RIFF header (a WAV or WebP "
                "header is 12 bytes before any data)")
    return None


SUPPORTED_IMAGES = {"png", "jpeg", "webp"}
SUPPORTED_AV = {"wav", "flac", "ogg", "mp3", "aac", "mp4", "webm"}
