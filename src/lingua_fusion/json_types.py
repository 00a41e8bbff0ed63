"""JSON as Python values: what ``json.loads`` returns and what ``json.dumps`` takes.

``JSONValue`` is for values that really are arbitrary JSON (a body read from a peer, a document passed through);
a body of a known shape has its own ``TypedDict`` where it is built. Values from outside the process that are not
yet checked are ``object`` and narrowed with ``isinstance`` where they are read.
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]
