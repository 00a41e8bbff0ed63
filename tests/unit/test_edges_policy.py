"""Edges of the commit policy: exact end-of-utterance and maximum-length commits, clicks, speech carried over a cut
(stream/policy.py).

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed.
"""

from __future__ import annotations

import numpy as np
import pytest

from lingua_fusion.stream.policy import SR, WINDOW, CommitPolicy, PolicyConfig, agreed_prefix

W = WINDOW / SR


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
    probs = [1.0, 1.0] + [0.0] * 19 + [1.0] * 20 + [0.0] * 30  # speech right after the click is forgotten
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
