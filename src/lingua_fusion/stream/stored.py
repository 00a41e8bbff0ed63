"""Values read back from the stream log (a snapshot, a stream's spec): the store wrote them from this package's own
types, so they are narrowed here with no second guess; a value of the wrong type is a bug (``TypeError``)."""

from __future__ import annotations


def _wrong(what: str, value: object) -> TypeError:
    return TypeError(f"the stream log holds {type(value).__name__} where {what} belongs")


def number(value: object) -> int | float | str:
    """A number, as ``int()`` / ``float()`` take it."""
    if not isinstance(value, int | float | str):
        raise _wrong("a number", value)
    return value


def text(value: object) -> str:
    if not isinstance(value, str):
        raise _wrong("a string", value)
    return value


def text_or_none(value: object) -> str | None:
    return None if value is None else text(value)


def items(value: object) -> list[object]:
    """A list (or tuple) whose items are read one by one."""
    if not isinstance(value, list | tuple):
        raise _wrong("a list", value)
    return list(value)


def texts(value: object) -> list[str]:
    """A list (or tuple) of strings, copied."""
    if not isinstance(value, list | tuple):
        raise _wrong("a list", value)
    return [text(v) for v in value]


def text_map(value: object) -> dict[str, str]:
    """A dict of strings, copied."""
    if not isinstance(value, dict):
        raise _wrong("an object", value)
    return {text(k): text(v) for k, v in value.items()}


def number_map(value: object) -> dict[str, float]:
    """A dict of numbers, copied (each number as it was)."""
    if not isinstance(value, dict):
        raise _wrong("an object", value)
    out: dict[str, float] = {}
    for k, v in value.items():
        if not isinstance(v, int | float):
            raise _wrong("a number", v)
        out[text(k)] = v
    return out


def texts_map(value: object) -> dict[str, list[str]]:
    """A dict of lists of strings, copied."""
    if not isinstance(value, dict):
        raise _wrong("an object", value)
    return {text(k): texts(v) for k, v in value.items()}
