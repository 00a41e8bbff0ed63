"""Edges of the pure cores that mutation testing (``make mutation``, scripts/mutation.py) found unguarded: exact
boundaries (``>`` against ``>=``), documented defaults, counters that must add up, and what is carried over when an
utterance is cut. One section per module; each test says the behaviour it pins.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lingua_fusion.glossary import Term
from lingua_fusion.serving.breaker import STEPS, SLOBreaker, Transition
from lingua_fusion.stream.policy import SR, WINDOW, CommitPolicy, PolicyConfig, agreed_prefix
from lingua_fusion.stream.timeline import AudioTimeline

W = WINDOW / SR


# ---- serving/breaker.py -------------------------------------------------------------------------------------------
def windows(b: SLOBreaker, slo: str, latencies: list[float], t0: float = 0.0, stage: str = "caption"
            ) -> list[Transition]:
    """One sample per window at the given latencies, each window closed by the next sample (and the last by a tick)."""
    out: list[Transition] = []
    for i, lat in enumerate(latencies):
        out += b.record(slo, lat, t0 + i * b.window_s, stage)
    return out + b.tick(t0 + len(latencies) * b.window_s)


def test_breaker_defaults_are_the_documented_ones() -> None:
    b = SLOBreaker({"standard": 3.0})
    assert (b.window_s, b.k, b.restore_ratio, b.min_samples) == (5.0, 3, 0.8, 1)
    assert b.target("standard", "caption") == 3.0 and b.target("standard", "no-such-stage") == 3.0
    assert SLOBreaker({"standard": 3.0}, stage_share={"mt": 0.3}).target("standard", "mt") == pytest.approx(0.9)


def test_a_window_is_judged_by_its_p99_not_its_worst_sample() -> None:
    b = SLOBreaker({"standard": 3.0}, window_s=1.0, k=1)
    for i in range(200):  # 2 outliers in 200 samples: over the p99
        b.record("standard", 10.0 if i < 2 else 1.0, i / 400)
    assert b.tick(1.0) == [] and b.level("standard") == 0


def test_a_window_exactly_at_target_neither_trips_nor_restores() -> None:
    b = SLOBreaker({"x": 5.0}, window_s=1.0, k=2)
    assert windows(b, "x", [5.0, 5.0, 5.0]) == []  # not over the target
    assert [t.to_level for t in windows(b, "x", [6.0, 6.0], t0=10.0)] == [1]
    assert windows(b, "x", [4.0, 4.0, 4.0], t0=20.0) == []  # exactly 0.8 x target: not under it, hold


def test_transitions_carry_their_rounded_p99_and_stage() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=1)
    down = windows(b, "x", [3.14159], stage="mt")
    assert down == [Transition("x", 1.0, 0, 1, 3.142, "mt")]
    up = windows(b, "x", [0.123456], t0=10.0)
    assert up == [Transition("x", 11.0, 1, 0, 0.123, "caption")]
    assert b.level("x") == 0


def test_after_a_move_every_run_of_the_class_starts_again() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=3)
    got = windows(b, "x", [2.0] * 9)
    assert [(t.at, t.to_level) for t in got] == [(3.0, 1), (6.0, 2), (9.0, 3)]  # every 3 windows, not every one


def test_a_move_of_one_class_leaves_the_other_classes_runs() -> None:
    b = SLOBreaker({"a": 1.0, "b": 1.0}, window_s=1.0, k=3)
    out = []
    for i in range(4):  # a breaches from window 0, b from window 1: a moves after window 2, b after window 3
        out += b.record("a", 2.0, float(i))
        out += b.record("b", 2.0 if i >= 1 else 0.5, float(i))
    out += b.tick(4.0)
    assert [(t.slo, t.at, t.to_level) for t in out] == [("a", 3.0, 1), ("b", 4.0, 1)]


def test_a_breached_window_resets_the_healthy_run() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=3)
    windows(b, "x", [2.0] * 3)
    assert b.level("x") == 1
    # healthy, healthy, breached, healthy, healthy: never 3 healthy windows in a row
    assert windows(b, "x", [0.1, 0.1, 2.0, 0.1, 0.1], t0=10.0) == []
    assert [t.to_level for t in windows(b, "x", [0.1], t0=15.0)] == [0]


def test_a_window_between_restore_and_target_breaks_both_runs() -> None:
    b = SLOBreaker({"x": 5.0}, window_s=1.0, k=3)
    assert windows(b, "x", [6.0, 6.0, 4.5, 6.0, 6.0]) == []  # 4.5: between 4.0 and 5.0, the run starts again
    windows(b, "x", [6.0], t0=5.0)
    assert b.level("x") == 1
    assert windows(b, "x", [1.0, 1.0, 4.5, 1.0, 1.0], t0=10.0) == []
    assert [t.to_level for t in windows(b, "x", [1.0], t0=15.0)] == [0]


def test_the_last_step_is_the_floor() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=1)
    got = windows(b, "x", [2.0] * (len(STEPS) + 3))
    assert [t.to_level for t in got] == list(range(1, len(STEPS) + 1))
    assert b.level("x") == len(STEPS)


def test_restore_goes_one_step_at_a_time() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=1)
    windows(b, "x", [2.0, 2.0])
    assert [t.to_level for t in windows(b, "x", [0.1, 0.1, 0.1], t0=10.0)] == [1, 0]


# ---- stream/policy.py ---------------------------------------------------------------------------------------------
def t_of(i: int) -> float:
    """The end time of window ``i`` (counted from 0), computed as the policy does."""
    return 0.0 + (i + 1) * WINDOW / SR


def run(p: CommitPolicy, probs: list[float], one_by_one: bool = False) -> list[tuple[int, str, float, float]]:
    """Feed ``probs`` right after what the policy has seen; (index of the last window fed in this call, kind, start,
    end) of each decision."""
    first = int(round(p._t_last * SR / WINDOW))
    out = []
    if one_by_one:
        for i, prob in enumerate(probs):
            out += [(i, d.kind, d.start, d.end) for d in p.on_vad(np.array([prob]), t_of(first + i))]
    else:
        out += [(len(probs) - 1, d.kind, d.start, d.end)
                for d in p.on_vad(np.array(probs), t_of(first + len(probs) - 1))]
    return out


def test_agreement_compares_words_case_and_punctuation_blind() -> None:
    assert agreed_prefix(["Hello,", "World"], ["hello", "world!", "again"]) == ["hello", "world!"]
    assert agreed_prefix(["Straße"], ["STRASSE"]) == []  # not the same word, whatever upper() says
    assert agreed_prefix(["a", "b"], ["a"]) == ["a"]


def test_a_click_is_forgotten_and_the_next_utterance_starts_0_3_s_before_it_was() -> None:
    cfg = PolicyConfig(eou_silence_s=t_of(20) - t_of(1))  # forgotten exactly at window 20
    p = CommitPolicy(cfg)
    probs = [1.0, 1.0] + [0.0] * 25 + [1.0] * 20 + [0.0] * 30
    commits = [d for d in run(p, probs) if d[1] == "commit"]
    assert len(commits) == 1
    assert commits[0][2] == pytest.approx(t_of(20) - 0.3)  # utt_start moved when the click was forgotten


def test_after_a_forgotten_click_silence_moves_the_utterance_start_along() -> None:
    p = CommitPolicy(PolicyConfig())
    run(p, [1.0, 1.0] + [0.0] * 25)  # a click, forgotten
    run(p, [0.0] * 30, one_by_one=False)
    assert p.speech_start is None and p.speech_s == 0.0
    p.on_vad(np.zeros(10), 5.0)
    assert p.utt_start == pytest.approx(5.0 - 0.3)


def test_two_clicks_are_two_clicks_not_a_word() -> None:
    p = CommitPolicy(PolicyConfig())
    assert run(p, [1.0, 1.0] + [0.0] * 25 + [1.0, 1.0] + [0.0] * 25) == []
    assert p.flush(2.0).kind == "wait"


def test_speech_of_exactly_the_minimum_length_is_committed() -> None:
    s = 0.0
    for _ in range(8):
        s += WINDOW / SR
    p = CommitPolicy(PolicyConfig(min_speech_s=s))
    assert [d[1] for d in run(p, [1.0] * 8 + [0.0] * 30)] == ["commit"]


def test_a_probability_exactly_at_the_threshold_is_speech() -> None:
    p = CommitPolicy(PolicyConfig())
    assert [d[1] for d in run(p, [0.5] * 20 + [0.0] * 30)] == ["commit"]


def test_commit_at_exactly_the_end_of_utterance_silence() -> None:
    cfg = PolicyConfig(eou_silence_s=t_of(29) - t_of(9), step_s=100.0)
    p = CommitPolicy(cfg)
    got = run(p, [1.0] * 10 + [0.0] * 30, one_by_one=True)
    assert [(i, k) for i, k, _s, _e in got] == [(29, "commit")]


def test_an_utterance_is_cut_at_exactly_its_maximum_length() -> None:
    cfg = PolicyConfig(max_utterance_s=t_of(49), step_s=100.0)
    p = CommitPolicy(cfg)
    got = run(p, [1.0] * 60, one_by_one=True)
    assert got[0][0] == 49 and got[0][1] == "commit"


def test_a_partial_exactly_one_step_in_and_exactly_at_the_minimum_speech() -> None:
    s = 0.0
    for _ in range(10):
        s += WINDOW / SR
    p = CommitPolicy(PolicyConfig(step_s=t_of(9), min_speech_s=s))
    got = run(p, [1.0] * 12, one_by_one=True)
    assert got[0][:2] == (9, "partial")


def test_silence_only_keeps_ten_windows_of_probabilities() -> None:
    p = CommitPolicy(PolicyConfig())
    for k in range(4):
        p.on_vad(np.zeros(20), (k + 1) * 20 * W)
        assert len(p.probs) == 10


def test_speech_seen_after_a_cut_belongs_to_the_next_utterance() -> None:
    cfg = PolicyConfig(max_utterance_s=t_of(48 + 9) - 1e-9, step_s=100.0)
    p = CommitPolicy(cfg)
    # cut at its maximum length at the quietest point of its last second (the dip); 8 + 9 windows of speech (9 at
    # exactly the threshold) already seen after the cut
    got = run(p, [1.0] * 40 + [0.1] + [1.0] * 8 + [0.5] * 9)
    cut = got[0][3]
    assert [d[1] for d in got] == ["commit"] and cut == pytest.approx(t_of(40))
    assert p.speech_s == pytest.approx(17 * W) and p.last_speech_end == pytest.approx(t_of(57))
    assert p.speech_start is not None and p.utt_start == pytest.approx(cut)
    rest = run(p, [0.0] * 40)
    assert len(rest) == 1 and rest[0][1] == "commit"
    # the next utterance starts at the cut and its speech ended with the last kept window
    assert rest[0][2] == pytest.approx(cut) and rest[0][3] == pytest.approx(t_of(57) + 0.2)


def test_one_window_of_speech_after_a_cut_is_a_click() -> None:
    cfg = PolicyConfig(max_utterance_s=t_of(48) - 1e-9, step_s=100.0)
    p = CommitPolicy(cfg)
    got = run(p, [1.0] * 40 + [0.1] + [0.2] * 7 + [1.0])  # the cut at the dip; one speech window after it
    assert [d[1] for d in got] == ["commit"] and got[0][3] == pytest.approx(t_of(40))
    assert p.speech_s == pytest.approx(W)
    assert run(p, [0.0] * 40) == []  # too short to be a word: forgotten, not committed


def test_after_a_commit_the_next_utterance_counts_its_speech_from_zero() -> None:
    p = CommitPolicy(PolicyConfig())
    assert [d[1] for d in run(p, [1.0] * 20 + [0.0] * 30)] == ["commit"]
    assert p.speech_s == 0.0
    assert run(p, [1.0, 1.0] + [0.0] * 30) == []  # a click after a commit is still a click


# ---- stream/timeline.py -------------------------------------------------------------------------------------------
def test_timeline_defaults_and_types() -> None:
    t = AudioTimeline()
    assert t.reorder_window == 2.0 and t.max_buffer == 60 * SR
    assert len(t.buf) == 0 and t.buf.dtype == np.float32
    assert t.view(0.0).dtype == np.float32 and t.view(0.0).size == 0
    t.write(np.ones(1600, dtype=np.float32), 0.0)
    assert t.buf.dtype == np.float32 and t.view(0.0).dtype == np.float32


def test_a_chunk_that_ends_exactly_where_consumed_audio_ends_is_late() -> None:
    t = AudioTimeline()
    t.write(np.ones(16000, dtype=np.float32), 0.0)
    t.consume(8000)
    assert t.write(np.ones(8000, dtype=np.float32), 0.0) is False
    assert t.write(np.ones(4000, dtype=np.float32), 0.1) is False
    assert t.stats.late_dropped == 2


def test_reorders_and_gaps_add_up() -> None:
    t = AudioTimeline()
    t.write(np.ones(1600, dtype=np.float32), 0.0)
    t.write(np.ones(1600, dtype=np.float32), 0.5)  # 0.4 s gap
    t.write(np.ones(1600, dtype=np.float32), 1.0)  # 0.4 s gap
    t.write(np.ones(800, dtype=np.float32), 0.2)  # into the first gap
    t.write(np.ones(800, dtype=np.float32), 0.7)  # into the second
    assert t.stats.gap_seconds == pytest.approx(0.8) and t.stats.reordered == 2


def test_a_full_buffer_releases_only_the_oldest_audio() -> None:
    t = AudioTimeline(max_buffer_s=1.0)
    t.write(np.full(int(0.8 * SR), 0.5, dtype=np.float32), 0.0)
    t.write(np.full(int(0.5 * SR), 0.25, dtype=np.float32), 0.8)
    assert t.start == int(0.3 * SR) and len(t.buf) == SR
    assert np.all(t.view(0.3, 0.8) == 0.5) and t.view(0.3, 0.8).size == int(0.5 * SR)


def test_a_resumed_timeline_places_the_first_timestamp_after_what_was_committed() -> None:
    t = AudioTimeline()
    t.start = t.end = 2 * SR  # resumed: 2 s committed, the client's clock origin unknown
    assert t.write(np.ones(1600, dtype=np.float32), 10.0)
    assert t.origin == pytest.approx(8.0) and t.stats.gap_seconds == 0.0 and t.end == 2 * SR + 1600


# ---- glossary.py --------------------------------------------------------------------------------------------------
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


# ---- media/sniff.py -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data,container", [
    (b"MM\x00*" + b"\x00" * 20, "tiff"), (b"II*\x00" + b"\x00" * 20, "tiff"),
    (b"\xff", "unknown"), (b"\xff\xfb", "mp3"), (b"\xff\xf1", "aac"),
    (b"a" * 4096 + b"\xff", "text"), (b"a" * 4096 + b"\x00", "text"), (b"a" * 4095 + b"\x00", "unknown"),
])
def test_sniff_edges(data: bytes, container: str) -> None:
    from lingua_fusion.media.sniff import sniff

    assert sniff(data).container == container


# ---- errors.py ----------------------------------------------------------------------------------------------------
def test_a_new_error_class_is_indexed_with_its_subclasses() -> None:
    from lingua_fusion import errors

    class Teapot(errors.ClientError):
        status = 418
        code = "test_teapot"

    class Kettle(Teapot):
        code = "test_kettle"

    try:
        errors._index(Teapot)
        assert errors._BY_CODE["test_teapot"] is Teapot and errors._BY_CODE["test_kettle"] is Kettle
        assert isinstance(errors.from_code("test_kettle", "hot"), Kettle)
    finally:
        errors._BY_CODE.pop("test_teapot", None)
        errors._BY_CODE.pop("test_kettle", None)


@pytest.mark.parametrize("status,client", [(400, True), (499, True), (500, False), (399, False), (None, False)])
def test_an_unknown_code_is_a_client_error_exactly_for_4xx(status: int | None, client: bool) -> None:
    from lingua_fusion.errors import ClientError, LinguaFusionError, from_code

    err = from_code("no_such_code", "m", status=status)
    assert isinstance(err, LinguaFusionError) and isinstance(err, ClientError) is client
    assert err.code == "no_such_code"


def test_overloaded_says_retry_after_one_second_by_default() -> None:
    from lingua_fusion.errors import Overloaded

    assert Overloaded("busy").retry_after == 1.0


# ---- stream/journal.py --------------------------------------------------------------------------------------------
class MemStore:
    """An in-memory stream store: what the journal asked of it, and switches for down, slow and lost."""

    def __init__(self) -> None:
        import threading

        self.calls: list[tuple[Any, ...]] = []
        self.down = False
        self.lost = False
        self.gate = threading.Event()  # cleared: append_final blocks until set (a slow store)
        self.gate.set()
        self.closed = False

    def open_stream(self, sid: str, token: str, snap: dict[str, Any]) -> None:
        self.calls.append(("open", sid, token, snap))

    def append_final(self, sid: str, final: dict[str, Any], committed: Any, origin: Any, text_until: Any) -> None:
        from lingua_fusion.errors import NotFound, StoreUnavailable

        self.gate.wait(30)
        if self.lost:
            raise NotFound("no such stream")
        if self.down:
            raise StoreUnavailable("redis down")
        self.calls.append(("append", final["seq"], committed, origin, text_until))

    def close_stream(self, sid: str) -> None:
        from lingua_fusion.errors import StoreUnavailable

        if self.down:
            raise StoreUnavailable("redis down")
        self.calls.append(("close", sid))

    def close(self) -> None:
        self.closed = True


class Gauge:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


class FakeMetrics:
    def __init__(self) -> None:
        self.unlogged_finals, self.store_failures = Gauge(), Gauge()


def final(seq: int, modality: str = "audio", end: float = 1.0) -> Any:
    from lingua_fusion.stream.events import Final

    return Final(start=0.0, end=end, source_text="x", text="x", translations={"es": "x"}, confidence=1.0, seq=seq,
                 modality=modality)


def journal_on(store: MemStore, wait_s: float = 5.0, metrics: Any = None) -> tuple[Any, list[Any]]:
    from lingua_fusion.stream.journal import Journal, StreamLog

    events: list[Any] = []
    return Journal(StreamLog(store, metrics), "st_1", events.append, wait_s=wait_s), events


async def test_the_journal_records_the_stream_and_each_finals_cursor() -> None:
    store, metrics = MemStore(), FakeMetrics()
    j, events = journal_on(store, metrics=metrics)
    await j.open("tok", {"source_lang": "en"})
    audio, text = final(1, "audio", 2.5), final(2, "text", 3.0)
    await j.append(audio, 10.0)
    await j.append(text, 10.0)
    assert store.calls == [("open", "st_1", "tok", {"spec": {"source_lang": "en"}}),
                           ("append", 1, 2.5, 10.0, None), ("append", 2, None, 10.0, 3.0)]
    assert audio.durable is None and text.durable is None and events == [] and j.logged_seq == 2
    assert metrics.unlogged_finals.value == 0 and j.pending == 0
    assert j._writer is not None and j._writer.get_name() == "journal:st_1"
    assert await j.finish(5.0) == 0 and store.calls[-1] == ("close", "st_1")
    await j.log.close()
    assert store.closed


async def test_an_outage_is_announced_once_and_its_end_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from lingua_fusion.stream.events import Durable, NotDurable

    store, metrics = MemStore(), FakeMetrics()
    j, events = journal_on(store, wait_s=0.05, metrics=metrics)
    store.down = True
    first, second = final(1), final(2)
    await j.append(first, 0.0)  # the log was healthy: the final waited for it, then went out not durable
    assert first.durable is False and metrics.store_failures.value == 1
    assert [type(e) for e in events] == [NotDurable] and events[0].from_seq == 1
    assert events[0].message == ("captions from 1 on are sent before they are crash-safe (the stream log is down); "
                                 "a durable event follows when they are")
    task = asyncio.create_task(j.append(second, 0.0))  # known down: no wait at all
    for _ in range(20):
        await asyncio.sleep(0)
        if task.done():
            break
    assert task.done() and second.durable is False and len(events) == 1 and metrics.unlogged_finals.value == 2
    store.down = False
    j.log.link.down_until = 0.0  # the backoff is over
    async with j._progress:
        await asyncio.wait_for(j._progress.wait_for(lambda: j.logged_seq == 2), 10)
    await asyncio.wait_for(j._writer, 10)  # type: ignore[arg-type]
    assert [type(e) for e in events] == [NotDurable, Durable] and events[1].through_seq == 2
    assert metrics.unlogged_finals.value == 0
    store.down = True  # a second outage is announced again
    third = final(3)
    j.log.link.down_until = 0.0
    await j.append(third, 0.0)
    assert [type(e) for e in events] == [NotDurable, Durable, NotDurable] and events[2].from_seq == 3
    j.detach()
    await j.log.close()


async def test_a_slow_write_is_called_slow() -> None:
    store = MemStore()
    store.gate.clear()
    j, events = journal_on(store, wait_s=0.05)
    f = final(1)
    await j.append(f, 0.0)
    assert f.durable is False and "(the stream log is slow)" in events[0].message
    store.gate.set()
    await j.log.close()


async def test_healthy_writes_announce_nothing() -> None:
    store = MemStore()
    j, events = journal_on(store)
    for seq in (1, 2, 3):
        f = final(seq)
        await j.append(f, 0.0)
        assert f.durable is None
    assert events == []
    await j.log.close()


async def test_the_writer_paces_its_retries_by_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    real_sleep = asyncio.sleep
    store = MemStore()
    j, _events = journal_on(store, wait_s=0.0)
    t = [100.0]
    j.log.link.clock = lambda: t[0]
    asked: list[float] = []
    failures = [3]

    def flaky(*args: Any) -> None:
        from lingua_fusion.errors import StoreUnavailable

        if failures[0]:
            failures[0] -= 1
            raise StoreUnavailable("redis down")
        return MemStore.append_final(store, *args)

    monkeypatch.setattr(store, "append_final", flaky)

    async def fake_sleep(d: float, *a: Any) -> None:
        asked.append(d)
        t[0] += d
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    await j.append(final(1), 0.0)
    async with asyncio.timeout(10):
        while j.logged_seq < 1:
            await real_sleep(0.01)
    # after each failure 0.05 s, then the rest of the backoff (0.5, 1, 2 s), at most 1 s at a time
    assert asked == pytest.approx([0.05, 0.45, 0.05, 0.95, 0.05, 1.0, 0.95])
    await j.log.close()


async def test_a_lost_stream_is_reported_once_and_not_retried() -> None:
    store = MemStore()
    store.lost = True
    j, events = journal_on(store, wait_s=0.05)
    await j.append(final(1), 0.0)
    await j._writer  # type: ignore[misc]
    errors = [e for e in events if e.TYPE == "error"]
    assert [e.code for e in errors] == ["not_found"] and errors[0].message == \
        "the stream log lost this stream: no such stream"
    assert j.pending == 0
    await j.log.close()


async def test_after_the_stream_closed_no_durable_event_and_the_log_owns_the_writer() -> None:
    import asyncio

    store = MemStore()
    j, events = journal_on(store, wait_s=0.05)
    j.detach()  # nothing pending, no writer: nothing to do
    store.down = True
    await j.append(final(1), 0.0)
    n = len(events)
    j.detach()
    assert j.log._orphans.get("st_1") is j._writer
    store.down = False
    j.log.link.down_until = 0.0
    await asyncio.wait_for(j.log.settled("st_1", wait_s=10), 11)
    assert ("append", 1, 1.0, 0.0, None) in store.calls and len(events) == n  # written; no durable event
    assert "st_1" not in j.log._orphans  # the finished writer is let go
    assert await j.finish(1.0) == 0
    await j.log.close()


async def test_the_journal_gives_up_a_closed_streams_backlog_only_after_its_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import types

    from lingua_fusion.stream import journal as journal_mod

    now = [1000.0]
    monkeypatch.setattr(journal_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store = MemStore()
    j, _events = journal_on(store, wait_s=0.05)
    store.down = True
    await j.append(final(1), 0.0)
    j.detach()  # closed at 1000.0
    now[0] = 1000.0 + journal_mod.BACKLOG_AFTER_CLOSE_S  # exactly its time: still trying
    store.down = False
    j.log.link.down_until = 0.0
    await asyncio.wait_for(j.log.settled("st_1", wait_s=10), 11)
    assert j.pending == 0
    store.down = True
    await j.append(final(2), 0.0)
    now[0] += journal_mod.BACKLOG_AFTER_CLOSE_S + 0.001  # past it: given up
    j.log.link.down_until = 0.0
    await asyncio.wait_for(j._writer, 10)  # type: ignore[arg-type]
    assert j.pending == 1
    await j.log.close()


async def test_finish_waits_for_the_backlog_and_closes_the_stream_only_when_it_is_empty() -> None:
    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    store.down = True
    await j.append(final(1), 0.0)
    assert await j.finish(0.05) == 1 and ("close", "st_1") not in store.calls
    store.down = False
    j.log.link.down_until = 0.0
    assert await j.finish(10.0) == 0 and store.calls[-1] == ("close", "st_1")
    await j.log.close()


async def test_settled_waits_a_bounded_time_and_survives_a_cancelled_writer() -> None:
    import asyncio

    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    await j.log.settled("nobody")  # no writer: nothing to wait for
    store.gate.clear()  # the write hangs
    await j.append(final(1), 0.0)
    j.detach()
    await asyncio.wait_for(j.log.settled("st_1", wait_s=0.05), 5)  # gave up waiting, did not raise
    waiting = asyncio.create_task(j.log.settled("st_1", wait_s=30))
    await asyncio.sleep(0)
    j.log._orphans["st_1"].cancel()
    await asyncio.wait_for(waiting, 5)  # the writer was cancelled: settled returns
    store.gate.set()
    await j.log.close()


async def test_a_newer_writer_is_not_let_go_when_an_older_one_ends() -> None:
    import asyncio

    from lingua_fusion.stream.journal import StreamLog

    log = StreamLog(MemStore())
    old_done, new_done = asyncio.Event(), asyncio.Event()
    old = asyncio.create_task(old_done.wait())
    new = asyncio.create_task(new_done.wait())
    log.adopt("st_1", old)
    log.adopt("st_1", new)
    old_done.set()
    await old
    await asyncio.sleep(0)
    assert log._orphans.get("st_1") is new
    new_done.set()
    await new
    await asyncio.sleep(0)
    assert "st_1" not in log._orphans
    await log.close()


async def test_closing_the_log_cancels_its_writers_and_closes_the_store() -> None:
    import asyncio

    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    store.down = True
    await j.append(final(1), 0.0)
    j.detach()
    writer = j.log._orphans["st_1"]
    await j.log.close()
    assert writer.cancelled() and j.log._orphans == {} and store.closed
    await asyncio.sleep(0)


async def test_a_log_call_gives_up_after_its_wait() -> None:
    from lingua_fusion.errors import StoreUnavailable

    store = MemStore()
    store.gate.clear()
    j, _events = journal_on(store)
    with pytest.raises(StoreUnavailable, match="did not answer"):
        await j.log.call(store.append_final, "st_1", {"seq": 1}, None, None, None, wait_s=0.05)
    store.gate.set()
    await j.log.close()


def test_after_a_restore_the_next_one_needs_k_healthy_windows_again() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=2)
    windows(b, "x", [2.0] * 4)
    assert b.level("x") == 2
    got = windows(b, "x", [0.1] * 4, t0=10.0)
    assert [(t.at, t.to_level) for t in got] == [(12.0, 1), (14.0, 0)]


async def test_a_healthy_write_returns_when_it_is_logged_not_after_the_whole_wait() -> None:
    import asyncio

    store = MemStore()
    j, events = journal_on(store, wait_s=120.0)  # a hang detector: the write itself takes milliseconds
    f = final(1)
    await asyncio.wait_for(j.append(f, 0.0), 30)
    assert f.durable is None and events == []
    await j.log.close()


async def test_a_write_that_lands_as_the_wait_runs_out_is_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    real_wait_for = asyncio.wait_for

    async def late(aw: Any, _limit: float | None) -> Any:  # the write lands, and the timeout fires anyway
        await real_wait_for(aw, 30)
        raise TimeoutError

    store = MemStore()
    j, events = journal_on(store, wait_s=1.0)
    monkeypatch.setattr(asyncio, "wait_for", late)
    f = final(1)
    await j.append(f, 0.0)
    monkeypatch.undo()
    assert f.durable is None and events == []
    await j.log.close()


async def test_finish_without_finals_and_with_the_log_gone_at_the_end() -> None:
    store = MemStore()
    j, _events = journal_on(store)
    assert await j.finish(1.0) == 0 and store.calls == [("close", "st_1")]  # no writer ever started
    await j.append(final(1), 0.0)
    store.down = True  # everything is logged, but recording the close fails: not an error for the stream
    assert await j.finish(1.0) == 0
    await j.log.close()


async def test_closing_the_log_survives_a_writer_that_failed() -> None:
    import asyncio

    from lingua_fusion.stream.journal import StreamLog

    log = StreamLog(MemStore())

    async def broken() -> None:
        raise RuntimeError("a bug in a writer")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    log._orphans["st_x"] = task  # finished with an error, still listed
    await log.close()
    assert log._orphans == {}


async def test_settled_gives_up_after_its_wait() -> None:
    import asyncio

    store = MemStore()
    j, _events = journal_on(store, wait_s=0.01)
    store.gate.clear()  # the write hangs (30 s)
    await j.append(final(1), 0.0)
    j.detach()
    loop = asyncio.get_running_loop()
    t = loop.time()
    await j.log.settled("st_1", wait_s=0.05)
    assert loop.time() - t < 10  # a hang detector: 0.05 s asked, the write hangs for 30 s
    store.gate.set()
    await j.log.close()


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
