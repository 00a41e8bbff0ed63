"""Language codes: validation and normalisation (ISO 639-1, with a few aliases)."""

from __future__ import annotations

from .errors import UnknownLanguage

# Whisper's language set (ISO 639-1 plus 'haw', 'yue') is the widest any installed model knows.
KNOWN = set(
    "af am ar as az ba be bg bn bo br bs ca cs cy da de el en es et eu fa fi fo fr gl gu ha haw he hi hr ht hu hy "
    "id is it ja jw ka kk km kn ko la lb ln lo lt lv mg mi mk ml mn mr ms mt my ne nl nn no oc pa pl ps pt ro ru "
    "sa sd si sk sl sn so sq sr su sv sw ta te tg th tk tl tr tt uk ur uz vi yi yo yue zh".split()
)
ALIASES = {"eng": "en", "spa": "es", "cat": "ca", "fra": "fr", "fre": "fr", "por": "pt", "deu": "de", "ger": "de",
           "zho": "zh", "chi": "zh", "cmn": "zh", "zh-cn": "zh", "zh-hans": "zh", "en-us": "en", "en-gb": "en",
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


_STOPWORDS = {
    "en": "the and is are of to in that it for with you this was on be have not",
    "es": "el la los las de que y en es un una por con para no se del al",
    "fr": "le la les de des et est un une que en du pour pas dans sur avec il",
    "pt": "o a os as de que e em um uma para com não do da no na é",
    "ca": "el la els les de que i en és un una per amb no del als",
    "de": "der die das und ist nicht ein eine zu den mit von sie ich es auf",
    "it": "il la di che e è un una per non con del della sono",
}
_SETS = {k: set(v.split()) for k, v in _STOPWORDS.items()}


def guess_text_language(text: str) -> str | None:
    """A cheap guess for text and OCR input (script, then stop words). None when unsure."""
    import re

    sample = text[:4000]
    cjk = sum(1 for c in sample if "\u4e00" <= c <= "\u9fff")
    letters = sum(1 for c in sample if c.isalpha())
    if letters and cjk / letters > 0.3:
        return "zh"
    words = re.findall(r"[^\W\d_]+", sample.lower())
    if not words:
        return None
    scores = {k: sum(1 for w in words if w in s) for k, s in _SETS.items()}
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] > 0 else None
