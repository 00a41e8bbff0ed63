"""JSON as Python values: what ``json.loads`` returns and what ``json.dumps`` takes.

``JSONValue`` is for values that really are arbitrary JSON (a body read from a peer, a document passed through);
a body of a known shape has its own ``TypedDict`` where it is built. Values from outside the process that are not
yet checked are ``object`` and narrowed with ``isinstance`` where they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]


def json_object(fields: Mapping[str, object]) -> JSONObject:
    """``fields`` as a JSON object, checked: nested mappings become objects, lists and tuples arrays; anything that
    is not JSON raises TypeError (an error's ``details`` are made of JSON values by the code that raises it)."""
    return {str(k): _json(v) for k, v in fields.items()}


def _json(value: object) -> JSONValue:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return json_object(value)
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")
