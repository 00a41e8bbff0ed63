"""Pure unit tests of the simultaneous commit policy, driven by synthetic VAD probabilities (32 ms windows)."""

from __future__ import annotations

import numpy as np
import pytest

from lingua_fusion.stream.policy import (
    SR,
    WINDOW,
    CommitPolicy,
    Decision,
    PartialPacer,
    PolicyConfig,
    agreed_prefix,
)

W = WINDOW / SR  # 0.032 s per VAD window
EPS = 1e-6


def speech(n: int) -> np.ndarray:
    return np.full(n, 0.9)


def silence(n: int) -> np.ndarray:
    return np.zeros(n)


def feed(policy: CommitPolicy, probs: np.ndarray, *, chunk: int, t0: float = 0.0) -> list[tuple[float, Decision]]:
    """Feed ``probs`` in calls of ``chunk`` windows; return (t_end of the call, decision) pairs."""
    out = []
    for k in range(0, len(probs), chunk):
        part = probs[k:k + chunk]
        t_end = t0 + (k + len(part)) * W
        out += [(t_end, d) for d in policy.on_vad(part, t_end)]
    return out


def kinds(pairs: list[tuple[float, Decision]]) -> list[str]:
    return [d.kind for _, d in pairs]


def test_constants_and_defaults() -> None:
    assert (SR, WINDOW) == (16000, 512)
    assert W == pytest.approx(0.032)
    cfg = PolicyConfig()
    assert (cfg.step_s, cfg.eou_silence_s, cfg.max_utterance_s) == (1.0, 0.6, 10.0)
    assert (cfg.speech_threshold, cfg.min_speech_s) == (0.5, 0.25)


# ---- silence -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 10, 1000])
def test_silence_only_gives_no_decisions(chunk: int) -> None:
    p = CommitPolicy()
    assert feed(p, silence(1000), chunk=chunk) == []  # 32 s
    assert p.speech_start is None
    assert p.flush(1000 * W) == Decision("wait")


def test_silence_moves_the_utterance_start_and_bounds_memory() -> None:
    p = CommitPolicy()
    feed(p, silence(500), chunk=10)
    assert p.utt_start == pytest.approx(500 * W - 0.3)
    assert len(p.probs) <= 10


def test_below_threshold_is_silence() -> None:
    p = CommitPolicy()
    assert p.on_vad(np.full(400, 0.49), 400 * W) == []
    assert p.speech_start is None


# ---- end of utterance ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7, 10, 2000])
def test_speech_then_silence_commits_once(chunk: int) -> None:
    p = CommitPolicy()
    probs = np.r_[speech(50), silence(60)]  # 1.6 s of speech, then 1.92 s of silence
    out = feed(p, probs, chunk=chunk)
    commits = [(t, d) for t, d in out if d.kind == "commit"]
    assert len(commits) == 1
    t, d = commits[0]
    last_speech = 50 * W
    assert d.start == pytest.approx(0.0, abs=EPS)
    assert last_speech <= d.end <= last_speech + 0.25
    assert d.end == pytest.approx(last_speech + 0.2)
    assert t >= last_speech + 0.6 - EPS  # not before eou_silence_s of silence
    assert p.utt_start >= d.end - EPS  # the next utterance never reaches back into this one
    assert p.speech_start is None
    assert p.flush(len(probs) * W) == Decision("wait")  # nothing pending any more


def test_commit_is_decided_at_the_first_window_with_enough_silence() -> None:
    p = CommitPolicy()
    out = feed(p, np.r_[speech(50), silence(60)], chunk=1)
    (t, d), = [(t, d) for t, d in out if d.kind == "commit"]
    # 0.6 s / 0.032 s = 18.75: the 19th silent window is the first with >= 0.6 s of silence
    assert t == pytest.approx((50 + 19) * W)


def test_pause_shorter_than_eou_does_not_commit() -> None:
    p = CommitPolicy()
    out = feed(p, np.r_[speech(40), silence(15), speech(40)], chunk=5)  # 0.48 s pause < 0.6 s
    assert "commit" not in kinds(out)
    assert p.speech_start == pytest.approx(0.0, abs=EPS)


def test_commit_starts_at_the_utterance_start_after_leading_silence() -> None:
    p = CommitPolicy()
    feed(p, silence(100), chunk=10)  # 3.2 s of silence in its own calls
    out = feed(p, np.r_[speech(40), silence(30)], chunk=10, t0=100 * W)
    (_, d), = [(t, d) for t, d in out if d.kind == "commit"]
    speech_start = 100 * W
    assert d.start == pytest.approx(speech_start - 0.3)  # a little lead-in, not the whole silence
    assert d.start <= speech_start
    assert speech_start + 40 * W <= d.end <= speech_start + 40 * W + 0.25


def test_two_utterances_in_one_call_commit_in_order() -> None:
    p = CommitPolicy()
    probs = np.r_[speech(50), silence(40), speech(40), silence(40)]
    out = p.on_vad(probs, len(probs) * W)
    commits = [d for d in out if d.kind == "commit"]
    assert len(commits) == 2
    first, second = commits
    assert first.start == pytest.approx(0.0, abs=EPS)
    assert first.end == pytest.approx(50 * W + 0.2)
    assert second.start >= first.end - EPS  # non-overlapping, in order
    assert second.start == pytest.approx(90 * W - 0.3)  # 0.3 s before its speech, as when fed window by window
    assert second.start <= 90 * W  # the second utterance's speech is inside it
    assert second.end == pytest.approx(130 * W + 0.2)
    assert out.index(first) < out.index(second)


@pytest.mark.parametrize("chunk", [1, 100, 1000])
def test_a_long_silence_then_speech_in_one_call_commits_only_the_speech(chunk: int) -> None:
    """A timestamp gap (silence) or one large message brings 20 s of silence and then speech in a call: the silence
    is neither committed (it was cut as an utterance of its own at 10 s, which Whisper heard as "you") nor decoded
    with the speech."""
    p = CommitPolicy()
    out = feed(p, np.r_[silence(625), speech(60), silence(30)], chunk=chunk)  # speech at 20 s
    commits = [d for _, d in out if d.kind == "commit"]
    assert len(commits) == 1
    assert commits[0].start == pytest.approx(625 * W - 0.3)
    assert commits[0].end == pytest.approx(685 * W + 0.2)


def test_utterances_in_one_call_match_window_by_window_feeding() -> None:
    probs = np.r_[speech(30), silence(25), speech(60), silence(30), speech(20), silence(40)]
    big = [d for d in CommitPolicy().on_vad(probs, len(probs) * W) if d.kind == "commit"]
    small = [d for _, d in feed(CommitPolicy(), probs, chunk=1) if d.kind == "commit"]
    assert len(big) == len(small) == 3
    for a, b in zip(big, small, strict=True):
        assert (a.start, a.end) == (pytest.approx(b.start), pytest.approx(b.end))
    ends = [d.end for d in big]
    assert ends == sorted(ends)


def test_short_blip_followed_by_silence_is_forgotten() -> None:
    p = CommitPolicy()
    # 0.16 s of "speech" (< min_speech_s 0.25: a click or breath), a 0.96 s pause, then a real utterance
    out = feed(p, np.r_[speech(5), silence(30), speech(40), silence(30)], chunk=5)
    commits = [d for _, d in out if d.kind == "commit"]
    assert len(commits) == 1
    # the blip is not decoded: the utterance starts shortly before the real speech (35 windows in), not at 0
    assert 35 * W - 0.35 <= commits[0].start <= 35 * W
    assert commits[0].end == pytest.approx(75 * W + 0.2)


def test_click_then_long_silence_does_not_hold_the_utterance_open() -> None:
    p = CommitPolicy()
    out = feed(p, np.r_[speech(4), silence(300)], chunk=10)
    assert [d for _, d in out if d.kind == "commit"] == []
    assert p.flush(304 * W).kind == "wait"


# ---- forced commit -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 10, 400])
def test_continuous_speech_is_cut_by_max_utterance(chunk: int) -> None:
    p = CommitPolicy()
    out = feed(p, speech(400), chunk=chunk)  # 12.8 s without a pause
    commits = [(t, d) for t, d in out if d.kind == "commit"]
    assert len(commits) == 1
    t, d = commits[0]
    assert d.start == pytest.approx(0.0, abs=EPS)
    assert 0.0 < d.end <= d.start + p.cfg.max_utterance_s
    assert d.end >= d.start + p.cfg.max_utterance_s - 1.0 - EPS  # cut inside the last second
    assert t <= d.start + p.cfg.max_utterance_s + chunk * W  # decided in the call whose windows reach 10 s
    # the speech after the cut starts the next utterance
    assert p.utt_start == pytest.approx(d.end)
    assert p.speech_start is not None


def test_forced_commit_cuts_at_the_quietest_window_of_the_last_second() -> None:
    probs = speech(400)
    probs[296] = 0.1  # a dip ending at 297 * 0.032 = 9.504 s
    out = CommitPolicy().on_vad(probs, len(probs) * W)
    commits = [d for d in out if d.kind == "commit"]
    assert len(commits) == 1
    assert commits[0].end == pytest.approx(297 * W)


def test_forced_commits_repeat_on_endless_speech() -> None:
    p = CommitPolicy(PolicyConfig(max_utterance_s=3.0))
    out = feed(p, speech(1000), chunk=10)  # 32 s
    commits = [d for _, d in out if d.kind == "commit"]
    assert len(commits) >= 10
    for a, b in zip(commits, commits[1:], strict=False):
        assert b.start == pytest.approx(a.end)
    for d in commits:
        assert 0.0 < d.end - d.start <= 3.0 + EPS


# ---- partials ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 5, 10, 40])
def test_partials_at_most_once_per_step(chunk: int) -> None:
    p = CommitPolicy()
    out = feed(p, speech(280), chunk=chunk)  # 8.96 s, under max_utterance_s
    partials = [(t, d) for t, d in out if d.kind == "partial"]
    assert "commit" not in kinds(out)
    assert len(partials) >= 4
    times = [t for t, _ in partials]
    for a, b in zip(times, times[1:], strict=False):
        assert b - a >= p.cfg.step_s - EPS
    assert len(partials) <= int(280 * W / p.cfg.step_s)
    for t, d in partials:
        assert d.start == pytest.approx(0.0, abs=EPS)
        assert d.end == pytest.approx(t)


def test_partial_step_follows_config() -> None:
    p = CommitPolicy(PolicyConfig(step_s=0.5))
    out = feed(p, speech(100), chunk=1)  # 3.2 s
    times = [t for t, d in out if d.kind == "partial"]
    assert len(times) == 6
    assert all(b - a >= 0.5 - EPS for a, b in zip(times, times[1:], strict=False))


def test_no_partial_before_min_speech() -> None:
    p = CommitPolicy()
    # 1.6 s of silence then 0.16 s of speech: time has passed but there is not enough speech yet
    assert p.on_vad(np.r_[silence(50), speech(5)], 55 * W) == []


def test_no_partials_during_silence() -> None:
    p = CommitPolicy()
    out = feed(p, np.r_[speech(50), silence(200)], chunk=10)
    assert kinds(out).count("commit") == 1
    commit_t = next(t for t, d in out if d.kind == "commit")
    assert all(t <= commit_t for t, d in out if d.kind == "partial")


# ---- flush ---------------------------------------------------------------------------------------------------
def test_flush_commits_pending_speech() -> None:
    p = CommitPolicy()
    feed(p, silence(20), chunk=10)
    feed(p, speech(30), chunk=10, t0=20 * W)
    d = p.flush(50 * W)
    assert d.kind == "commit"
    assert d.start == pytest.approx(20 * W - 0.3)
    assert d.end == pytest.approx(50 * W)


def test_flush_after_silence_waits() -> None:
    p = CommitPolicy()
    feed(p, np.r_[speech(50), silence(60)], chunk=10)  # already committed
    assert p.flush(110 * W) == Decision("wait", 0.0, 0.0)


def test_flush_on_a_fresh_policy_waits() -> None:
    assert CommitPolicy().flush(0.0).kind == "wait"


# ---- LocalAgreement ------------------------------------------------------------------------------------------
def test_agreed_prefix_ignores_case_and_punctuation() -> None:
    assert agreed_prefix(["Hello,", "World"], ["hello", "world!"]) == ["hello", "world!"]
    assert agreed_prefix(["it's"], ["Its"]) == ["Its"]  # returns the newer hypothesis's words


def test_agreed_prefix_stops_at_first_difference() -> None:
    a = ["the", "cat", "sat", "on", "the", "mat"]
    b = ["The", "cat", "sits", "on", "the", "mat"]
    assert agreed_prefix(a, b) == ["The", "cat"]
    assert agreed_prefix(["a", "b"], ["x", "b"]) == []
    assert agreed_prefix(["one", "two", "three"], ["one", "two"]) == ["one", "two"]
    assert agreed_prefix([], ["anything"]) == []


def test_stable_is_local_agreement_2() -> None:
    p = CommitPolicy()
    assert p.stable(["Hello", "wor"]) == []  # first hypothesis: nothing to agree with
    assert p.stable(["hello,", "world", "how"]) == ["hello,"]
    assert p.stable(["Hello", "world", "how", "are"]) == ["Hello", "world", "how"]
    assert p.stable(["Goodbye"]) == []
    assert p.prev_hyp == ["Goodbye"]


def test_commit_resets_local_agreement() -> None:
    p = CommitPolicy()
    p.stable(["hello", "world"])
    p.on_vad(np.r_[speech(50), silence(60)], 110 * W)  # commits
    assert p.prev_hyp == []
    assert p.stable(["hello", "world"]) == []


# ---- PartialPacer: partials spaced by load -------------------------------------------------------------------

def test_a_fast_engine_keeps_the_class_step_between_partials() -> None:
    pacer = PartialPacer(step_s=0.5, max_hop_s=6.0)
    starts = []
    for k in range(1, 21):  # the policy offers a partial every 0.5 s; each comes back in 0.1 s
        now = 0.5 * k
        if pacer.due(now):
            pacer.started(now)
            starts.append(now)
            pacer.done(0.1)
    assert len(starts) == 20 and pacer.hop_s == 0.5


def test_a_slow_round_trip_spaces_partials_and_a_fast_one_brings_them_back() -> None:
    pacer = PartialPacer(step_s=0.5, max_hop_s=6.0)
    pacer.started(0.0)
    pacer.done(0.8)  # the engine is busy: 0.8 s for a partial
    assert pacer.hop_s == pytest.approx(2.0)  # 2.5 x the round trip
    assert not pacer.due(1.0) and pacer.due(2.0)  # the offer at 1.5 s is skipped: 2.0 - 0.25 s of slack
    for t in (2.0, 4.0, 6.0):  # the load is gone
        pacer.started(t)
        pacer.done(0.05)
    assert pacer.hop_s == 0.5


def test_an_overloaded_engine_gets_about_one_partial_an_utterance_never_none() -> None:
    pacer = PartialPacer(step_s=0.5, max_hop_s=6.0)
    pacer.started(0.0)
    pacer.done(30.0)  # shed at its deadline, or a queue far behind
    assert pacer.hop_s == 6.0
    assert not pacer.due(5.0) and pacer.due(6.0)  # the probe that will find the load gone


def test_a_partial_the_engine_refused_at_once_doubles_the_hop() -> None:
    """A full queue refuses a partial in a millisecond: that is load, not a fast engine."""
    pacer = PartialPacer(step_s=0.5, max_hop_s=6.0)
    pacer.started(0.0)
    pacer.done(0.1)
    assert pacer.hop_s == 0.5
    hops = []
    for _ in range(4):
        pacer.shed(0.001)
        hops.append(pacer.hop_s)
    assert hops == [pytest.approx(1.0), pytest.approx(2.0), pytest.approx(4.0), 6.0]
    off = PartialPacer(step_s=0.5, max_hop_s=6.0, ratio=0.0)  # LINGUAFUSION_SERVER__PARTIAL_PACE=0
    off.shed(0.001)
    assert off.hop_s == 0.5


def test_partials_thin_faster_than_the_round_trip_grows_once_it_nears_the_target() -> None:
    """server.partial_pace_full: 2.5x the round trip while it is short, 10x once it is 0.4 s (interactive's target
    is 1 s): a busy engine spends its time on committed captions; an idle one's partials keep the class step."""
    pacer = PartialPacer(step_s=0.5, max_hop_s=6.0, ratio=2.5, full_ratio=10.0, full_rtt_s=0.4)
    plain = PartialPacer(step_s=0.5, max_hop_s=6.0, ratio=2.5)
    hops = []
    for rtt in (0.05, 0.2, 0.4, 0.8):
        pacer.rtt_s = plain.rtt_s = rtt
        hops.append((pacer.hop_s, plain.hop_s))
    assert hops[0] == (0.5, 0.5)  # fast: every step either way
    assert hops[1] == (pytest.approx(1.25), 0.5)  # halfway to full: 6.25 x 0.2 s
    assert hops[2] == (pytest.approx(4.0), pytest.approx(1.0))  # at full: 10 x 0.4 s against 2.5 x
    assert hops[3] == (6.0, pytest.approx(2.0))  # capped at the class's longest utterance


def test_a_session_paces_its_partials_from_the_settings_and_its_slo_class() -> None:
    from fakes import session

    from lingua_fusion.config import Settings
    from lingua_fusion.stream.protocol import StreamSpec

    settings = Settings()
    settings.server.partial_pace_full = 10.0
    fast = session(settings=settings, spec=StreamSpec(source_lang="en", targets=["es"], slo="interactive"))
    loose = session(settings=settings, spec=StreamSpec(source_lang="en", targets=["es"], slo="standard"))
    assert (fast.decisions.pacer.full_ratio, fast.decisions.pacer.full_rtt_s) == (10.0, pytest.approx(0.4))
    assert loose.decisions.pacer.full_rtt_s == pytest.approx(1.2)  # 0.4 of its 3 s target
    assert session().decisions.pacer.full_ratio == 0.0  # the default: a constant pace
