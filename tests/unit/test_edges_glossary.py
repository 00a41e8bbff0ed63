"""Edges of the glossary: the flat fallback pattern, case folding, trie suffixes, placeholders, names, deadlines,
messages, limits (glossary.py).

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed.
"""

from __future__ import annotations

import pytest

from lingua_fusion.glossary import Term


def test_the_flat_pattern_a_deep_glossary_falls_back_to_matches_like_the_trie(monkeypatch: pytest.MonkeyPatch) -> None:
    from lingua_fusion import glossary

    def too_deep(keys: list[str]) -> str:
        raise RecursionError("maximum recursion depth exceeded")

    terms = (Term("bank", "orilla"), Term("bank account", "cuenta"), Term("a.b", "AB"))
    for flat in (False, True):
        if flat:
            monkeypatch.setattr(glossary, "_trie_regex", too_deep)
        m = glossary.Matcher(terms)
        found = [(x.group(0), t.target) for x, t in m.find("The Bank account, the bank, axb and a.b.")]
        assert found == [("Bank account", "cuenta"), ("bank", "orilla"), ("a.b", "AB")], flat


def test_the_first_spelling_of_a_term_wins_whatever_the_case_in_the_text() -> None:
    from lingua_fusion.glossary import Matcher

    m = Matcher((Term("Bank", "orilla"), Term("bank", "ribera")))
    assert [t.target for _x, t in m.find("bank BANK Bank")] == ["orilla"] * 3


def test_terms_whose_case_folding_is_not_one_to_one_are_found() -> None:
    from lingua_fusion.glossary import Matcher

    m = Matcher((Term("Straße", "street"), Term("İstanbul", "Istanbul")))
    assert [(x.group(0), t.target) for x, t in m.find("die Straße, in istanbul, die STRAẞE")] == \
        [("Straße", "street"), ("istanbul", "Istanbul"), ("STRAẞE", "street")]


def test_a_term_and_its_longer_forms_each_match_whole() -> None:
    from lingua_fusion.glossary import Matcher

    m = Matcher((Term("bank", "B"), Term("banker", "BR"), Term("banks", "BS"), Term("bar", "R")))
    assert [t.target for _x, t in m.find("bank banker banks bar banke bankers")] == ["B", "BR", "BS", "R"]
    single = Matcher((Term("bank", "B"), Term("banker", "BR")))
    assert [t.target for _x, t in single.find("the bank, the banker, the banke")] == ["B", "BR"]


def test_an_empty_matcher_finds_nothing_and_changes_nothing() -> None:
    from lingua_fusion.glossary import Matcher

    m = Matcher(())
    assert m.find("anything") == [] and m.sub("anything", lambda t: "X") == "anything"


def test_small_glossaries_are_compiled_per_call_and_large_ones_once() -> None:
    from lingua_fusion.glossary import SMALL, matcher

    small = [Term(f"w{i}", "x") for i in range(SMALL)]
    large = [Term(f"w{i}", "x") for i in range(SMALL + 1)]
    assert matcher(small) is not matcher(small)  # exactly SMALL: not worth a cache slot
    assert matcher(large) is matcher(large) and matcher(large).find("w32")[0][1] == large[32]


def test_placeholders_are_numbered_from_900_in_order_of_appearance_and_names_come_after() -> None:
    from lingua_fusion.glossary import protect

    text, found = protect("the river by the bank, the bank", [Term("bank", "orilla"), Term("river", "rio")],
                          [Term("Acme", "Acme")])
    assert text == "the [900] by the [901], the [901]"
    assert found == {"[900]": Term("river", "rio"), "[901]": Term("bank", "orilla")}
    text, found = protect("Acme by the bank", [Term("bank", "orilla")], [Term("Acme", "Acme")])
    assert text == "[901] by the [900]" and found["[901]"] == Term("Acme", "Acme")


def test_names_alone_are_protected_in_a_batch() -> None:
    from lingua_fusion.glossary import apply_mt_batch

    outs, applied = apply_mt_batch(["Acme is big", "Acme is big"], [[], []], lambda xs: [x.upper() for x in xs],
                                   names=[[Term("Acme", "Acme")], []])
    assert outs == ["Acme IS BIG", "ACME IS BIG"] and applied == [[Term("Acme", "Acme")], []]


def test_a_batch_with_mismatched_lengths_is_an_error_not_a_short_answer() -> None:
    from lingua_fusion.glossary import apply_mt_batch

    with pytest.raises(ValueError):
        apply_mt_batch(["the bank", "the bank"], [[Term("bank", "x")]], lambda xs: xs)
    calls = []

    def loses_one(xs: list[str]) -> list[str]:  # the retry pass answers fewer texts than it was given
        calls.append(xs)
        return [x.replace("[900]", "") for x in xs] if len(calls) == 1 else []

    with pytest.raises(ValueError):
        apply_mt_batch(["the bank"], [[Term("bank", "x")]], loses_one)


def test_apply_mt_reports_each_term_once_over_all_texts() -> None:
    from lingua_fusion.glossary import apply_mt

    outs, applied = apply_mt(["the bank", "the river", "the bank"], [Term("bank", "orilla"), Term("river", "rio")],
                             lambda xs: xs)
    assert outs == ["the orilla", "the rio", "the orilla"]
    assert applied == [Term("bank", "orilla"), Term("river", "rio")]


def test_a_passed_deadline_stops_the_glossary_work_and_says_where() -> None:
    from lingua_fusion.deadline import Deadline
    from lingua_fusion.errors import RequestTimeout
    from lingua_fusion.glossary import apply_mt, apply_mt_batch

    gone = Deadline(0.0, clock=lambda: 5.0)
    with pytest.raises(RequestTimeout, match=r"stopped at glossary\)"):
        apply_mt(["the bank"], [Term("bank", "x")], lambda xs: xs, deadline=gone)
    t = [0.0]
    later = Deadline(1.0, clock=lambda: t[0])

    def slow(xs: list[str]) -> list[str]:  # the first pass loses the placeholder and uses up the time
        t[0] = 2.0
        return ["lost" for _ in xs]

    with pytest.raises(RequestTimeout, match=r"stopped at glossary\)"):
        apply_mt_batch(["the bank"], [[Term("bank", "x")]], slow, deadline=later)


@pytest.mark.parametrize("data,message", [
    (b"\xff\xfe", "glossary must be UTF-8 CSV or JSON"),
    (b"[1, 2, 3]", "glossary JSON items must be {source, target} or [source, target]"),
    (b'"just a string"', "glossary JSON must be an object or a list"),
    (b'{"bank": ""}', "glossary terms must be non-empty strings"),
    (b"source,target\n", "glossary holds no terms"),
    (b"a" * 200_000 + b",b\n", "glossary CSV is malformed: "),  # over csv's field size limit
])
def test_glossary_errors_say_what_is_wrong(data: bytes, message: str) -> None:
    from lingua_fusion.errors import InvalidParameter
    from lingua_fusion.glossary import parse

    with pytest.raises(InvalidParameter) as ei:
        parse(data, max_terms=10, filename="g.json" if data.startswith(b'"') else "")
    assert ei.value.message.startswith(message), ei.value.message


def test_term_length_limits_are_inclusive_and_each_side_counts() -> None:
    from lingua_fusion.errors import InvalidParameter, TooLarge
    from lingua_fusion.glossary import MAX_TERM_CHARS, parse

    ok = parse(f"{'s' * MAX_TERM_CHARS},{'t' * 10 * MAX_TERM_CHARS}".encode(), max_terms=10)
    assert len(ok) == 1
    for src, tgt in ((MAX_TERM_CHARS + 1, 1), (1, 10 * MAX_TERM_CHARS + 1)):
        with pytest.raises(InvalidParameter, match=r"at most 100 characters \(targets 1000\)"):
            parse(f"{'s' * src},{'t' * tgt}".encode(), max_terms=10)
    with pytest.raises(TooLarge, match="glossary has 3 terms; the limit is 2"):
        parse(b"a,b\nc,d\ne,f\n", max_terms=2)


def test_csv_header_with_extra_columns_and_quoted_newlines() -> None:
    from lingua_fusion.glossary import parse

    assert parse(b"source,target,notes\nbank,orilla,river\n", max_terms=10) == [Term("bank", "orilla")]
    assert parse(b'bank,"or\r\nilla"\n', max_terms=10) == [Term("bank", "or\r\nilla")]


def test_an_exact_spelling_wins_over_a_case_insensitive_one() -> None:
    from lingua_fusion.glossary import Matcher

    m = Matcher((Term("istanbul", "A"), Term("İstanbul", "B")))
    assert [(x.group(0), t.target) for x, t in m.find("in İstanbul and istanbul")] == \
        [("İstanbul", "B"), ("istanbul", "A")]


def test_an_empty_matcher_matches_nothing_between_words_either() -> None:
    from lingua_fusion.glossary import Matcher

    assert Matcher(()).find("a - b, c") == [] and Matcher(()).sub(" - ", lambda t: "X") == " - "


def test_hot_words_are_the_first_sources_joined() -> None:
    from lingua_fusion.glossary import hotwords

    terms = [Term(f"w{i}", "x") for i in range(50)]
    assert hotwords(terms) == ", ".join(f"w{i}" for i in range(40))
    assert hotwords(terms[:3], limit=2) == "w0, w1"
