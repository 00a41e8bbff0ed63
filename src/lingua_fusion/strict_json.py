"""JSON from clients, parsed strictly at the boundary (WebSocket messages, JSON bodies, glossary files).

Two things Python's ``json.loads`` accepts that are not text a server can keep:
- ``NaN`` / ``Infinity``: Python's extension, not JSON;
- a lone UTF-16 surrogate (``"\\ud800"``): a valid JSON escape that names no character. It parses into a ``str``
  that no UTF-8 encoder takes, so it failed later and far away: SQLite refused it (a 500 on ``POST /v1/glossaries``,
  ``/v1/keys``, ``/v1/vocabularies``) and the model processes' msgpack wire refused it (a stream's text message
  killed the stream's caption emitter under ``serve --workers``: no ``closed``, later captions lost).

Both raise ``ValueError`` here, which every caller already maps to ``invalid_parameter``. A surrogate *pair*
(``"\\ud83d\\ude00"``) is one character and passes.

Given ``bounds``, the text is measured before it is parsed (json_bounds.py): deeper or with more elements than
they allow is a ``TooLarge`` (413), and nothing is parsed.
"""

from __future__ import annotations

import json
import re
from typing import NoReturn

from .json_bounds import JsonBounds, check
from .json_types import JSONValue

_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def loads(raw: str | bytes, bounds: JsonBounds | None = None) -> JSONValue:
    """``json.loads`` that refuses NaN / Infinity and lone surrogates (``ValueError``; ``RecursionError`` on
    nesting too deep, as ``json.loads``) and, given ``bounds``, a text past them before parsing (``TooLarge``)."""
    if bounds is not None:
        check(raw, bounds)
    obj: JSONValue = json.loads(raw, parse_constant=_not_json)
    escaped = _SURROGATE_BYTES.search(raw) if isinstance(raw, bytes) else _SURROGATE.search(raw)
    if escaped is not None:  # rare: only then is the whole value checked
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a lone UTF-16 surrogate (\\ud800-\\udfff) is not a character") from None
    return obj
