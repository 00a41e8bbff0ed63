"""Decoding and validation with hard limits. No other part of the package imports PyAV or PIL for input."""

from .audio import decode_audio
from .image import decode_image
from .sniff import MediaKind, sniff

__all__ = ["MediaKind", "decode_audio", "decode_image", "sniff"]
