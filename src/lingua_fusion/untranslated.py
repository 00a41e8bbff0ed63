"""Words an MT engine left untranslated, named instead of passed off as a translation (pure).

Apertium marks a word its dictionaries do not know with ``*`` (``*soleado``: run without ``-u``). The mark travels
with the text through every leg of a route (a pivot's second leg marks the first leg's leftovers again:
``**soleado``, or a Spanish word left in French) and through the translation memory, and is taken off where a
translation reaches a user: the file result's ``warnings`` and the stream final's ``untranslated`` and ``note``.
"""

from __future__ import annotations

import re

MARK = re.compile(r"(?<![\w*])\*+(?=\w)")
WORD = re.compile(r"(?<![\w*])\*+(\w[\w'’-]*)")


def strip_marks(text: str) -> tuple[str, list[str]]:
    """(the text without marks, the marked words in order, each once)."""
    words = list(dict.fromkeys(WORD.findall(text)))
    return (MARK.sub("", text) if words else text), words


def warning(words: list[str], target: str) -> str:
    return (f"untranslated words left as written in the {target} text (no dictionary knew them; check the "
            f"translation): {', '.join(words)}")
