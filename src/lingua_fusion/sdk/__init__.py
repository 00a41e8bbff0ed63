"""Python SDK: ``MultimodalTranslator`` over HTTP, an async twin, and an in-process mode with no server."""

from .client import AsyncMultimodalTranslator, MultimodalTranslator
from .local import LocalTranslator

__all__ = ["AsyncMultimodalTranslator", "LocalTranslator", "MultimodalTranslator"]
