"""Adaptive frame sampling: few frames analysed while the picture is still, many while it (or a hand) moves,
never more than the stream's budget; frames decoded vs analysed reported."""

from __future__ import annotations

import numpy as np

from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.landmarks import LandmarkFrame
from lingua_fusion.vision.sampler import AdaptiveSampler, SamplingPolicy

FPS = 30


def _run(sampler: AdaptiveSampler, frames: list[np.ndarray], seconds: float) -> list[float]:
    analysed = []
    for i in range(int(seconds * FPS)):
        t = i / FPS
        if sampler.offer(t, frames[i % len(frames)]):
            analysed.append(t)
    return analysed


def test_a_still_picture_is_analysed_at_the_minimum_rate() -> None:
    still = np.full((240, 320, 3), 128, np.uint8)
    s = AdaptiveSampler(SamplingPolicy(min_fps=2, max_fps=15, budget_fps=10))
    analysed = _run(s, [still], 10.0)
    assert 19 <= len(analysed) <= 22  # 2 a second (and the first frame)
    assert s.stats().decoded == 300 and s.stats().analysed == len(analysed)


def test_a_moving_picture_is_analysed_up_to_the_budget_not_beyond() -> None:
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 255, (240, 320, 3), dtype=np.uint8) for _ in range(4)]
    s = AdaptiveSampler(SamplingPolicy(min_fps=2, max_fps=15, budget_fps=10, burst=8))
    analysed = _run(s, noise, 10.0)
    assert 95 <= len(analysed) <= 10 * 10 + 8  # the budget, plus its burst
    assert s.over_budget > 0  # the rate wanted 15 a second; the budget said 10


def test_motion_then_stillness_changes_the_rate_within_a_second() -> None:
    rng = np.random.default_rng(1)
    still = np.full((240, 320, 3), 90, np.uint8)
    s = AdaptiveSampler(SamplingPolicy(min_fps=2, max_fps=15, budget_fps=15, burst=15))
    analysed = []
    for i in range(9 * FPS):
        t = i / FPS
        moving = 3 <= t < 6
        frame = rng.integers(0, 255, (240, 320, 3), dtype=np.uint8) if moving else still
        if s.offer(t, frame):
            analysed.append(t)
    counts = [sum(1 for t in analysed if k <= t < k + 1) for k in range(9)]
    assert all(c <= 3 for c in counts[1:3]) and all(c <= 3 for c in counts[7:])
    assert all(c >= 12 for c in counts[4:6])


def test_a_moving_hand_raises_the_rate_while_the_picture_barely_changes() -> None:
    still = np.full((240, 320, 3), 128, np.uint8)
    s = AdaptiveSampler(SamplingPolicy(min_fps=2, max_fps=15, budget_fps=15, burst=15))
    rng = np.random.default_rng(2)
    spec = syn.sign_vocabulary(1, seed=1)[0]
    sign = syn.perform_sign(spec, syn.Performance(duration=3.0, noise=0.0), rng).frames()
    analysed = 0
    for i in range(3 * FPS):
        t = i / FPS
        if s.offer(t, still):
            analysed += 1
            hand = sign[min(i, len(sign) - 1)]
            # the hands sweep across the picture at 0.5 units (about 7 palm lengths) a second
            s.observe(LandmarkFrame(t, hand.hands + np.float32(t * 0.5), hand.hand_present,
                                    hand.pose, False, hand.lips, False))
    assert analysed > 3 * 2 * 2  # well above the still rate of 2 a second
    s.observe(LandmarkFrame.empty(3.0))  # a hand missed once: still moving, probably
    assert s.rate() > 10
    s.observe(LandmarkFrame.empty(3.6))  # hands gone for longer than hold_s: back to the still rate
    assert s.rate() == 2.0
