"""The mediapipe worker for real: mediapipe 0.10.21 in .venv-vision, run as a subprocess over the framed protocol.

Real frames: a photograph (Grace Hopper's portrait, shipped inside matplotlib) moved across the frame, and a
rendered hand moved along a known path. The worker's failures: killed between calls (restarted), never answering
(a timeout, the process killed), no interpreter (a clear error).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image

from lingua_fusion.errors import BackendError, ModelTimeout
from lingua_fusion.vision.extractor import MediapipeExtractor
from lingua_fusion.vision.synthetic import render_hand

PORTRAIT = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


@pytest.fixture(scope="module")
def extractor() -> Iterator[MediapipeExtractor]:
    ex = MediapipeExtractor(session="tests")
    yield ex
    ex.close()


def _portrait_frames(shifts: list[int]) -> list[tuple[float, np.ndarray]]:
    img = np.asarray(Image.open(PORTRAIT).convert("RGB"))[:540]
    frames = []
    for k, dx in enumerate(shifts):
        canvas = np.full((600, 800, 3), 90, np.uint8)
        canvas[30:30 + img.shape[0], dx:dx + img.shape[1]] = img
        frames.append((k / 10, canvas))
    return frames


def test_the_worker_runs_mediapipe_0_10_21_with_numpy_1(extractor: MediapipeExtractor) -> None:
    hello = extractor.hello()
    assert hello["mediapipe"] == "0.10.21" and hello["numpy"].startswith("1.")


def test_lips_are_found_on_a_real_face_and_follow_it_across_the_frame(extractor: MediapipeExtractor) -> None:
    shifts = [0, 40, 80, 120, 160, 200]
    frames = extractor.extract(_portrait_frames(shifts), parts=frozenset({"lips", "hands", "pose"}))
    assert [f.lips_present for f in frames] == [True] * 6
    for f in frames:  # absent parts are zeros, never a guess; present ones are inside the picture
        for h in (0, 1):
            assert f.hand_present[h] or not f.hands[h].any()
            assert not f.hand_present[h] or (f.hands[h] > -0.1).all() and (f.hands[h] < 1.1).all()
        assert f.pose_present and 0.2 < f.pose[0, 0] < 0.8  # the nose
    centres = np.array([f.lips.mean(axis=0) for f in frames])
    # the picture moves 40 px a frame on an 800 px wide canvas: 0.05 image units
    np.testing.assert_allclose(np.diff(centres[:, 0]), 0.05, atol=0.006)
    np.testing.assert_allclose(np.diff(centres[:, 1]), 0.0, atol=0.006)
    mouth = np.linalg.norm(frames[0].lips[10] - frames[0].lips[0])  # corner to corner
    assert 0.03 < mouth < 0.15  # a mouth, not the whole face or a point
    assert extractor.timings["lips"] > 0 and extractor.timings["hands"] > 0


def test_a_rendered_hand_is_tracked_along_its_path(extractor: MediapipeExtractor) -> None:
    path = [(0.3 + 0.4 * i / 15, 0.75) for i in range(16)]
    frames = extractor.extract([(i / 15, render_hand(p)) for i, p in enumerate(path)], parts=frozenset({"hands"}))
    found = [(p, f) for p, f in zip(path, frames, strict=True) if f.any_hand]
    assert len(found) >= 12
    xs = np.array([f.hands[0 if f.hand_present[0] else 1, 0, 0] for _, f in found])
    drawn = np.array([p[0] for p, _ in found])  # the canvas is 640 wide: x units are fractions of the width
    np.testing.assert_allclose(xs - xs[0], drawn - drawn[0], atol=0.03)


def test_a_killed_worker_is_restarted_by_the_next_call() -> None:
    ex = MediapipeExtractor(session="restart")
    try:
        ex.hello()
        assert ex._proc is not None
        ex._proc.kill()
        ex._proc.wait(timeout=10)
        frames = ex.extract(_portrait_frames([0]), parts=frozenset({"lips"}))
        assert frames[0].lips_present and ex.restarts == 2
    finally:
        ex.close()


def test_a_worker_that_never_answers_times_out_and_is_killed(tmp_path: Path) -> None:
    silent = tmp_path / "python"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(silent.stat().st_mode | stat.S_IEXEC)
    ex = MediapipeExtractor(silent, start_timeout_s=1.0, timeout_s=1.0)
    with pytest.raises(ModelTimeout):
        ex.hello()
    assert ex._proc is None  # killed, not left behind


def test_a_missing_interpreter_is_a_clear_backend_error(tmp_path: Path) -> None:
    ex = MediapipeExtractor(tmp_path / "no-such-python")
    with pytest.raises(BackendError, match="cannot start the vision worker"):
        ex.hello()


def test_a_worker_that_exits_mid_call_is_a_retryable_error_with_its_last_words(tmp_path: Path) -> None:
    dying = tmp_path / "python"
    dying.write_text("#!/bin/sh\nhead -c 10 >/dev/null\necho 'out of memory' >&2\nexit 3\n")
    dying.chmod(dying.stat().st_mode | stat.S_IEXEC)
    ex = MediapipeExtractor(dying, start_timeout_s=5.0)
    with pytest.raises(BackendError, match="exited") as err:
        ex.hello()
    assert err.value.retryable and "out of memory" in err.value.message
    assert ex._proc is None
