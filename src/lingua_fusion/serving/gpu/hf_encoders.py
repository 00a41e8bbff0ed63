"""Hugging Face text encoders run without reading the GPU back.

A read of a device tensor on the host (``bool(t)``, ``.item()``) makes the calling thread wait until the GPU has
run everything queued before it: the runner cannot queue the next kernels meanwhile, so launching and running stop
overlapping. Marian's encoder layer makes one per layer in float16: ``if ... not torch.isfinite(h).all(): h =
clamp(h)``, an overflow guard. ``device_only``
gives the encoder's Marian layers the same guard computed on the device (``torch.where`` on the 0-d "anything not
finite" flag: the same values, no read). Other architectures are returned as they are, and so is a Marian layer
of another transformers contract (4.x's returns a tuple and takes a head mask: ``_ours`` checks the return type).
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch

PATCHED = "_lf_device_only"


def _marian_layer(self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  **kwargs: Any) -> torch.Tensor:
    """MarianEncoderLayer.forward at inference (no dropout), its float16 guard on the device."""
    residual = hidden_states
    h: torch.Tensor  # the layer's modules are transformers': their calls are untyped
    h, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
    h = self.self_attn_layer_norm(residual + h)
    h = self.final_layer_norm(h + self.fc2(self.activation_fn(self.fc1(h))))
    if h.dtype == torch.float16:
        bound = torch.finfo(h.dtype).max - 1000
        h = torch.where(torch.isfinite(h).all(), h, h.clamp(-bound, bound))
    return h


def _ours(layer: Any) -> bool:
    """``layer`` is the MarianEncoderLayer ``_marian_layer`` copies (transformers 5: it returns a tensor)."""
    if type(layer).__name__ != "MarianEncoderLayer":
        return False
    try:
        returns = inspect.signature(type(layer).forward).return_annotation
    except (TypeError, ValueError):
        return False
    return returns in (torch.Tensor, "torch.Tensor")


def device_only(encoder: Any) -> Any:
    """``encoder`` (an nn.Module, in eval mode) with its Marian layers' guard kept on the device; once per module."""
    if getattr(encoder, PATCHED, False) or encoder.training:
        return encoder
    for layer in getattr(encoder, "layers", ()):
        if _ours(layer):
            layer.forward = types.MethodType(_marian_layer, layer)
    setattr(encoder, PATCHED, True)
    return encoder
