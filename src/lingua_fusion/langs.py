"""Language codes: validation and normalisation (ISO 639-1, with a few aliases); the text language identifier."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import UnknownLanguage

if TYPE_CHECKING:
    from py3langid.langid import LanguageIdentifier

# Whisper's language set (ISO 639-1 plus 'haw', 'yue') is the widest any installed model knows.
KNOWN = set(
    "af am ar as az ba be bg bn bo br bs ca cs cy da de el en es et eu fa fi fo fr gl gu ha haw he hi hr ht hu hy "
    "id is it ja jw ka kk km kn ko la lb ln lo lt lv mg mi mk ml mn mr ms mt my ne nl nn no oc pa pl ps pt ro ru "
    "sa sd si sk sl sn so sq sr su sv sw ta te tg th tk tl tr tt uk ur uz vi yi yo yue zh".split()
)
ALIASES = {"eng": "en", "spa": "es", "cat": "ca", "fra": "fr", "fre": "fr", "por": "pt", "deu": "de", "ger": "de",
           "zho": "zh", "chi": "zh", "cmn": "zh", "zh-cn": "zh", "zh-hans": "zh", "en-us": "en", "en-gb": "en",
           # Chinese tags keep their script apart (models/transcript_guard.py script_for): zh-TW gives Traditional
           "zh-sg": "zh", "zh-tw": "zh", "zh-hant": "zh", "zh-hk": "zh",
           "es-es": "es", "es-mx": "es", "pt-br": "pt", "pt-pt": "pt", "fr-fr": "fr"}
NAMES = {"en": "English", "es": "Spanish", "ca": "Catalan", "fr": "French", "pt": "Portuguese", "de": "German",
         "zh": "Chinese", "it": "Italian"}


def normalize(code: str | None, *, field: str = "language") -> str:
    if code is None or not str(code).strip():
        raise UnknownLanguage(f"{field} is empty", details={"field": field})
    c = str(code).strip().lower().replace("_", "-")
    c = ALIASES.get(c, c)
    if c not in KNOWN:
        raise UnknownLanguage(f"unknown {field} code {code!r}; use an ISO 639-1 code such as 'en' or 'es'",
                              details={"field": field, "value": str(code)[:32]})
    return c


def name(code: str) -> str:
    return NAMES.get(code, code)


# Languages the text identifier chooses between: every language a model here serves or that an installed model
# reads, plus the widely written ones a user may send by mistake (so that Italian is called Italian and refused
# as an unsupported pair, not taken for Spanish). Fewer candidates make short texts less ambiguous.
IDENTIFIED = ("en es fr pt ca de it nl zh ja ko ru ar pl sv da no tr el uk cs ro hu fi hi vi id gl eu").split()
CONFIDENT = 0.6  # below this a guess is refused: checked on short phrases in 7 languages, no wrong guess above it


@dataclass(frozen=True)
class LanguageGuess:
    """The identifier's best language for a text and its probability among ``IDENTIFIED`` (0-1)."""

    lang: str | None
    confidence: float

    @property
    def sure(self) -> bool:
        return self.lang is not None and self.confidence >= CONFIDENT


_identifier: LanguageIdentifier | None = None
_identifier_lock = threading.Lock()


def _model() -> LanguageIdentifier:
    """py3langid's Naive Bayes model (inside its wheel, nothing downloaded), loaded once per process."""
    global _identifier
    with _identifier_lock:
        if _identifier is None:
            from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

            ident = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
            ident.set_languages(IDENTIFIED)
            _identifier = ident
        return _identifier


def identify(text: str) -> LanguageGuess:
    """The language of ``text`` (text input, OCR lines) with the identifier's confidence.

    Short texts are the hard case: "Hola" or "Ciao" get a low confidence, and callers refuse to guess then.
    """
    sample = text[:4000]
    if not any(c.isalpha() for c in sample):
        return LanguageGuess(None, 0.0)
    lang, prob = _model().classify(sample)
    lang = str(lang)
    return LanguageGuess(lang if lang in KNOWN else None, round(float(prob), 3))


def identify_among(text: str, candidates: list[str]) -> str:
    """The most likely of ``candidates`` for ``text`` (they must be in ``IDENTIFIED``)."""
    ranked = {str(lang): float(p) for lang, p in _model().rank(text[:4000])}
    return max(candidates, key=lambda c: ranked.get(c, 0.0))


def guess_text_language(text: str) -> str | None:
    """The language of ``text`` when the identifier is sure of it, else None."""
    guess = identify(text)
    return guess.lang if guess.sure else None
