"""What a translation-memory entry is keyed by (pure).

A translation depends on the source segment, the route that made it (each leg's backend, model and languages) and
the glossary in force (terms and the slide names protected with it). The glossary's version is the digest of its
content: glossaries are immutable once uploaded (a changed list is a new glossary id), and keying by content means
one key's identical glossaries share entries while any difference, one term or one target, is another key. A
translation made with another glossary, or with none, can never be returned. Entries are per API key (``scope``):
shared across keys, a hit's speed (``latency_ms.mt``) would tell one customer what another had translated.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

from ..glossary import Term

_SPACE = re.compile(r"\s+")
NO_GLOSSARY = "none"


def normalise(segment: str) -> str:
    """NFC, runs of white space as one space, no leading or trailing space. Case and punctuation are kept: the
    engines translate "Bank" and "bank." differently."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", segment)).strip()


def glossary_version(terms: Sequence[Term], names: Sequence[Term] = ()) -> str:
    """The digest of the terms (order-free) and the protected names; ``none`` for neither."""
    if not terms and not names:
        return NO_GLOSSARY
    h = hashlib.sha256()
    for group in (terms, names):
        for source, target in sorted({(t.source, t.target) for t in group}):
            h.update(source.encode("utf-8") + b"\x1f" + target.encode("utf-8") + b"\x1e")
        h.update(b"\x1d")
    return h.hexdigest()[:32]


def entry_key(segment: str, route: str, glossary: str, scope: str = "") -> str:
    """One digest for (scope, normalised segment, route, glossary version): the key in both tiers. ``scope``: whose
    memory (the API key's id): a key never gets, nor can time, another key's cached translation."""
    raw = "\x1f".join((scope, route, glossary, normalise(segment))).encode("utf-8")
    return hashlib.sha256(raw).hexdigest()
