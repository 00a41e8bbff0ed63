"""Unit tests for lingua_fusion.glossary (pure: no models)."""

from __future__ import annotations

import json
import re

import pytest

from lingua_fusion import glossary
from lingua_fusion.errors import InvalidParameter, TooLarge
from lingua_fusion.glossary import Term, apply_mt, protect

EXPECTED = [Term("bank", "banco"), Term("credit card", "tarjeta de crédito")]


def parse(data: bytes | str, max_terms: int = 100, filename: str = "") -> list[Term]:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return glossary.parse(data, max_terms=max_terms, filename=filename)


# ---- parse: CSV ----------------------------------------------------------------------------------------------
def test_csv_without_header() -> None:
    assert parse("bank,banco\ncredit card,tarjeta de crédito\n") == EXPECTED


def test_csv_with_header() -> None:
    assert parse("source,target\nbank,banco\ncredit card,tarjeta de crédito\n") == EXPECTED


def test_csv_header_is_case_and_space_insensitive() -> None:
    assert parse(" Source , TARGET \nbank,banco\ncredit card,tarjeta de crédito") == EXPECTED


def test_csv_blank_lines_and_whitespace_are_skipped_and_stripped() -> None:
    text = "\nbank , banco \n\n   \n,\ncredit card,tarjeta de crédito\n\n"
    # a row of only commas is blank too
    assert parse(text) == EXPECTED


def test_csv_utf8_bom() -> None:
    data = b"\xef\xbb\xbf" + "source,target\nbank,banco\ncredit card,tarjeta de crédito\n".encode()
    assert parse(data) == EXPECTED


def test_csv_bom_without_header() -> None:
    data = "\ufeffbank,banco\n".encode()
    assert parse(data) == [Term("bank", "banco")]


def test_csv_quoted_fields() -> None:
    assert parse('"Smith, Inc.","Smith, S.A."\n') == [Term("Smith, Inc.", "Smith, S.A.")]


def test_csv_row_with_one_column_is_invalid() -> None:
    with pytest.raises(InvalidParameter, match="line 2"):
        parse("bank,banco\njustone\n")


def test_csv_empty_target_is_invalid() -> None:
    with pytest.raises(InvalidParameter, match="non-empty"):
        parse("bank, \n")


# ---- parse: JSON ---------------------------------------------------------------------------------------------
def test_json_object() -> None:
    assert parse(json.dumps({"bank": "banco", "credit card": "tarjeta de crédito"})) == EXPECTED


def test_json_list_of_dicts() -> None:
    data = json.dumps([{"source": "bank", "target": "banco"},
                       {"source": "credit card", "target": "tarjeta de crédito", "note": "ignored"}])
    assert parse(data) == EXPECTED


def test_json_list_of_pairs() -> None:
    assert parse(json.dumps([["bank", "banco"], ["credit card", "tarjeta de crédito"]])) == EXPECTED


def test_json_terms_wrapper() -> None:
    assert parse(json.dumps({"terms": {"bank": "banco", "credit card": "tarjeta de crédito"}})) == EXPECTED
    assert parse(json.dumps({"terms": [["bank", "banco"], ["credit card", "tarjeta de crédito"]]})) == EXPECTED


def test_json_with_bom_and_leading_whitespace() -> None:
    data = b"\xef\xbb\xbf  \n" + json.dumps({"bank": "banco"}).encode()
    assert parse(data) == [Term("bank", "banco")]


def test_json_by_filename() -> None:
    # content does not start with { or [, but the .json name forces the JSON path -> invalid JSON
    with pytest.raises(InvalidParameter, match="JSON"):
        parse("bank,banco", filename="terms.json")


@pytest.mark.parametrize("data", ["{not json", "[1, 2", '{"a": }'])
def test_json_invalid(data: str) -> None:
    with pytest.raises(InvalidParameter, match="JSON is invalid"):
        parse(data)


@pytest.mark.parametrize("data", ['[["bank"]]', '[{"source": "bank"}]', '["bank"]', "[1]"])
def test_json_bad_items(data: str) -> None:
    with pytest.raises(InvalidParameter):
        parse(data)


def test_json_scalar_is_invalid() -> None:
    with pytest.raises(InvalidParameter):
        parse('"just a string"', filename="x.json")


def test_json_non_string_terms_invalid() -> None:
    with pytest.raises(InvalidParameter, match="non-empty strings"):
        parse(json.dumps({"bank": 3}))


# ---- parse: emptiness, size, encoding ------------------------------------------------------------------------
@pytest.mark.parametrize("data", ["", "\n\n", "source,target\n", "{}", "[]", '{"terms": []}'])
def test_empty_glossary_is_invalid(data: str) -> None:
    with pytest.raises(InvalidParameter, match="no terms"):
        parse(data)


def test_not_utf8_is_invalid() -> None:
    with pytest.raises(InvalidParameter, match="UTF-8"):
        parse(b"bank,\xff\xfe\xfa\n")


def test_too_many_terms() -> None:
    data = "\n".join(f"t{i},u{i}" for i in range(6))
    assert len(parse(data, max_terms=6)) == 6
    with pytest.raises(TooLarge) as ei:
        parse(data, max_terms=5)
    assert ei.value.status == 413


# ---- protect ----------------------------------------------------------------------------------------------
def test_protect_longest_match_first() -> None:
    terms = [Term("card", "tarjeta"), Term("credit card", "tarjeta de crédito")]
    text, mapping = protect("Pay with a credit card or a card.", terms)
    assert list(mapping.values())[0] == Term("credit card", "tarjeta de crédito")
    k_long = next(k for k, t in mapping.items() if t.source == "credit card")
    k_short = next(k for k, t in mapping.items() if t.source == "card")
    assert text == f"Pay with a {k_long} or a {k_short}."
    assert "credit" not in text


def test_protect_case_insensitive_whole_word() -> None:
    terms = [Term("bank", "banco")]
    text, mapping = protect("The Bank and the BANK, not banking or riverbank.", terms)
    (key,) = mapping
    assert re.fullmatch(r"\[\d+\]", key)
    assert text == f"The {key} and the {key}, not banking or riverbank."
    assert mapping[key] == Term("bank", "banco")


def test_protect_bank_does_not_match_banking() -> None:
    text, mapping = protect("Online banking is easy.", [Term("bank", "banco")])
    assert text == "Online banking is easy."
    assert mapping == {}


def test_protect_regex_special_characters_are_literal() -> None:
    text, mapping = protect("We use C++ and C#.", [Term("C++", "C más más")])
    assert len(mapping) == 1
    assert "C++" not in text and "C#" in text


def test_protect_distinct_placeholders() -> None:
    terms = [Term("bank", "banco"), Term("loan", "préstamo")]
    text, mapping = protect("a bank loan", terms)
    assert len(mapping) == 2 and len(set(mapping)) == 2
    for k in mapping:
        assert k in text


# ---- apply_mt with fake translators ---------------------------------------------------------------------------
WORDS = {"the": "el", "bank": "orilla", "is": "está", "open": "abierto", "today": "hoy", "good": "bueno"}
PLACEHOLDER_RE = re.compile(r"\[\d+\]")


class FakeMT:
    """Word-by-word via WORDS; unknown tokens (placeholders included) pass through unless ``destroy``."""

    def __init__(self, destroy: bool = False) -> None:
        self.destroy = destroy
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[str]:
        self.calls.append(list(texts))
        out = []
        for t in texts:
            words = []
            for w in t.split():
                if PLACEHOLDER_RE.fullmatch(w):
                    if self.destroy:
                        words.append("(" + w.strip("[]") + ")")  # mangled
                        continue
                    words.append(w)
                else:
                    words.append(WORDS.get(w.lower(), w))
            out.append(" ".join(words))
        return out


def test_apply_mt_placeholders_pass_through() -> None:
    mt = FakeMT()
    terms = [Term("bank", "banco")]
    out, applied = apply_mt(["The bank is open", "good today"], terms, mt)
    assert out == ["el banco está abierto", "bueno hoy"]
    assert applied == [Term("bank", "banco")]
    assert len(mt.calls) == 1
    assert "bank" not in mt.calls[0][0]  # the MT never saw the source term
    assert "orilla" not in out[0]


def test_apply_mt_fallback_when_placeholders_destroyed() -> None:
    mt = FakeMT(destroy=True)
    terms = [Term("bank", "banco")]
    out, applied = apply_mt(["The bank is open", "good today"], terms, mt)
    assert "banco" in out[0]
    assert out[0] == "el banco está abierto"
    assert out[1] == "bueno hoy"
    assert applied == [Term("bank", "banco")]
    assert len(mt.calls) == 2
    assert mt.calls[1] == ["The banco is open"]  # only the mangled segment is retried, target substituted


def test_apply_mt_no_terms_calls_translate_once_unchanged() -> None:
    mt = FakeMT()
    texts = ["The bank is open", "[1] stays"]
    out, applied = apply_mt(texts, [], mt)
    assert mt.calls == [texts]
    assert out == ["el orilla está abierto", "[1] stays"]
    assert applied == []


def test_apply_mt_terms_absent_from_text() -> None:
    mt = FakeMT()
    out, applied = apply_mt(["good today"], [Term("bank", "banco")], mt)
    assert out == ["bueno hoy"]
    assert applied == []
    assert mt.calls == [["good today"]]
