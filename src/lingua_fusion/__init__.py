"""LinguaFusion: real-time multimodal translation (speech, images, text -> text, speech, braille)."""

from .errors import LinguaFusionError
from .sdk import AsyncMultimodalTranslator, LocalTranslator, MultimodalTranslator
from .types import Modality, Segment, TranslationResult

__all__ = ["AsyncMultimodalTranslator", "LinguaFusionError", "LocalTranslator", "Modality", "MultimodalTranslator",
           "Segment", "TranslationResult"]
__version__ = "0.1.0"
