"""The JSON scanner (json_bounds.py): depth and element count measured before parsing, exactly at a bound and one
past it; brackets, commas and escaped quotes inside strings never count; the scan's pieces do not change what it
finds; a bound is refused as 413 too_large before anything is parsed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lingua_fusion import json_bounds, strict_json
from lingua_fusion.errors import TooLarge
from lingua_fusion.json_bounds import JsonBounds, JsonShape, check, measure
from lingua_fusion.vision import bigjson


def shape_of(obj: Any) -> tuple[int, int]:
    """(depth, elements) of a parsed value, as json_bounds defines them: a container of n values counts
    max(1, n), its children are added."""
    if isinstance(obj, dict):
        kids = [shape_of(v) for v in obj.values()]
    elif isinstance(obj, list):
        kids = [shape_of(v) for v in obj]
    else:
        return 0, 0
    return 1 + max((d for d, _ in kids), default=0), max(1, len(kids)) + sum(e for _, e in kids)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_depth_exactly_at_the_bound_passes_and_one_past_is_refused() -> None:
    bounds = JsonBounds(max_depth=64, max_elements=1_000)
    assert measure(nested(64)) == JsonShape(64, 64)
    check(nested(64), bounds)
    with pytest.raises(TooLarge) as exc:
        check(nested(65), bounds)
    assert exc.value.status == 413 and exc.value.details["limit"] == "max_json_depth"
    assert "65 deep" in exc.value.message and "64" in exc.value.message


def test_elements_exactly_at_the_bound_pass_and_one_past_are_refused() -> None:
    bounds = JsonBounds(max_depth=64, max_elements=100)
    at = json.dumps(list(range(100)))  # one list of 100 values: '[' and 99 commas
    assert measure(at) == JsonShape(1, 100)
    check(at, bounds)
    with pytest.raises(TooLarge) as exc:
        check(json.dumps(list(range(101))), bounds)
    assert exc.value.details["limit"] == "max_json_elements" and "limits.max_json_elements" in exc.value.message
    landmarks = JsonBounds(64, 10, "vision.max_json_elements")
    with pytest.raises(TooLarge, match="vision.max_json_elements"):
        check("[" + ",".join("[]" for _ in range(6)) + "]", landmarks)  # 1 + 5 commas + 6 lists = 12


def test_brackets_commas_and_escaped_quotes_inside_strings_do_not_count() -> None:
    texts = ['["[[[[,,,{{{"]', r'["a\"[[[[", "]]]]"]', r'["\\", "[[[["]', r'["\\\"[[[[,"]', r'{"k\"[": "\\\\"}',
             '["\\u005b\\u005b", "\\"]"]', '"' + "[" * 1000 + '"']
    for text in texts:
        obj = json.loads(text)
        assert (measure(text).depth, measure(text).elements) == shape_of(obj), text
        check(text, JsonBounds(max_depth=2, max_elements=2))  # within: nothing in the strings counted


def test_an_odd_run_of_backslashes_escapes_the_quote_and_an_even_one_does_not() -> None:
    even = r'["\\\\", [[1]]]'  # the string is two backslashes; the lists after it count
    odd = r'["\\\"[[1]]"]'  # a backslash and an escaped quote: the brackets are inside the string
    assert measure(even).depth == 3 and measure(odd).depth == 1


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64])
def test_the_pieces_do_not_change_the_result(monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    text = r'{"a": ["x\"[,", [[1, 2], {"b": "]]\\"}]], "c": "' + "[" * 20 + '"}'
    want = measure(text)
    monkeypatch.setattr(json_bounds, "PIECE", piece)
    assert measure(text) == want == JsonShape(*shape_of(json.loads(text)))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{},"\\:ab \n'),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(alphabet='[]{},"\\a'), kids, max_size=4),
    max_leaves=40)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_the_scan_agrees_with_the_parsed_value(value: Any, compact: bool) -> None:
    text = json.dumps(value, separators=(",", ":") if compact else None, ensure_ascii=False)
    assert (measure(text).depth, measure(text).elements) == shape_of(value)
    assert (measure(text.encode()).depth, measure(text.encode()).elements) == shape_of(value)


def test_a_bound_is_refused_before_anything_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr(strict_json.json, "loads", parsed)
    bounds = JsonBounds(max_depth=64, max_elements=100_000)
    deep = b"[" * (4 * 1024 * 1024)
    lists = b"[" + b"[]," * (2 * 1024 * 1024) + b"[]]"
    for body in (deep, lists):
        with pytest.raises(TooLarge):
            strict_json.loads(body, bounds)
    stopped = measure(lists, bounds)
    assert stopped.stopped and stopped.elements > 100_000  # the scan ended at the first piece past the bound


def test_a_message_with_few_brackets_passes_at_a_glance() -> None:
    image = json.dumps({"type": "image", "data": "QUJD" * 100_000})
    assert json_bounds.within_at_a_glance(image.encode(), JsonBounds(64, 100))
    check(image, JsonBounds(2, 3))


def test_the_landmark_parser_takes_the_bounds_after_its_run_check() -> None:
    frames = [{"t": i / 30, "pose": [[0.5, 0.5]] * 3} for i in range(3)]
    body = json.dumps({"gloss": "hi", "frames": frames}).encode()
    depth, elements = shape_of(json.loads(body))
    assert depth == 5
    assert bigjson.loads(body, JsonBounds(5, elements))["gloss"] == "hi"
    with pytest.raises(TooLarge):
        bigjson.loads(body, JsonBounds(4, elements))
    with pytest.raises(TooLarge):
        bigjson.loads(body, JsonBounds(5, elements - 1))
