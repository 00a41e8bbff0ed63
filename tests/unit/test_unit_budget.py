"""A stream's audio budget (stream/budget.py): a message too long for the bucket is refused before any work, a stream
ahead of its allowed speed waits exactly its debt, and a stream at real time never waits."""

from __future__ import annotations

import pytest

from lingua_fusion.errors import TooLarge
from lingua_fusion.stream.budget import PACED_CODE, AudioBudget, check_message


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_message_of_exactly_the_burst_is_taken_and_one_sample_more_is_refused() -> None:
    check_message(30.0, 30.0)
    with pytest.raises(TooLarge) as err:
        check_message(30.0 + 1 / 16000, 30.0)
    assert err.value.details == {"limit": "max_audio_burst_s", "seconds": 30.0}
    assert "at most 30 s" in err.value.message


def test_a_live_source_at_real_time_never_waits() -> None:
    clock = Clock()
    budget = AudioBudget(speed=4.0, burst_s=30.0, clock=clock)
    for _ in range(10_000):  # 100 ms chunks, 100 ms apart: 1x real time for 1,000 s
        assert budget.charge(0.1) == 0.0
        clock.t += 0.1
    assert budget.paced == 0 and budget.notice() is None


def test_a_fast_sender_waits_its_debt_at_the_allowed_speed() -> None:
    clock = Clock()
    budget = AudioBudget(speed=4.0, burst_s=30.0, clock=clock)
    assert budget.charge(30.0) == 0.0  # a full burst at once
    assert budget.charge(20.0) == pytest.approx(5.0)  # 20 s owed at 4x: 5 s
    notice = budget.notice()
    assert notice is not None and notice.code == PACED_CODE and notice.details == {
        "limit": "max_audio_speed", "speed": 4.0, "burst_s": 30.0}
    assert budget.notice() is None  # told once
    clock.t += 5.0  # the reader waited
    assert budget.charge(4.0) == pytest.approx(1.0)
    clock.t += 1.0
    # over a long run a sender that always waits what it is told goes at the allowed speed, not faster
    start, fed = clock.t, 0.0
    for _ in range(100):
        clock.t += budget.charge(10.0)
        fed += 10.0
    assert fed / (clock.t - start) == pytest.approx(4.0, rel=0.05)


def test_the_bucket_refills_only_up_to_its_burst() -> None:
    clock = Clock()
    budget = AudioBudget(speed=2.0, burst_s=10.0, clock=clock)
    clock.t += 3600  # an hour idle banks no more than one burst
    assert budget.charge(10.0) == 0.0
    assert budget.charge(1.0) == pytest.approx(0.5)
    with pytest.raises(TooLarge):
        budget.charge(10.5)


def test_a_keys_pixel_budget_takes_one_largest_image_at_once_then_paces() -> None:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.stream.budget import pixel_budget

    clock = Clock()
    limits = LimitSettings(max_key_pixels_per_s=16e6, max_image_pixels=40_000_000)
    budget = pixel_budget(limits, clock)
    assert budget.charge(40e6) == 0.0  # one picture of the largest size always fits
    assert budget.charge(40e6) == pytest.approx(2.5)  # the next waits for its pixels at 16 MP/s
    notice = budget.notice()
    assert notice is not None and notice.code == "pictures_paced"
    assert notice.details is not None and notice.details["limit"] == "max_key_pixels_per_s"
    small = pixel_budget(LimitSettings(max_key_pixels_per_s=1e6, max_image_pixels=4_000_000), clock)
    assert small.burst == 4e6 and small.charge(4e6) == 0.0  # a rate below one image still lets one image through


def test_a_pictures_header_gives_its_pixels_without_decoding_it() -> None:
    import io

    from PIL import Image

    from lingua_fusion.media.image import image_pixels

    buf = io.BytesIO()
    Image.new("L", (6300, 6300)).save(buf, "PNG")
    assert image_pixels(buf.getvalue()) == 6300 * 6300
    assert image_pixels(b"not an image") == 0  # decoding then says why


async def test_paying_charges_tells_once_and_waits_out_exactly_the_debt() -> None:
    """stream/budget.py pay: the audio ingest and the pictures both pay through it."""
    from lingua_fusion.stream.budget import pay
    from lingua_fusion.stream.events import Error

    clock = Clock()
    budget = AudioBudget(speed=4.0, burst_s=30.0, clock=clock)
    told: list[Error] = []
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        clock.t += s

    await pay(budget, 30.0, told.append, sleep)  # the burst at once: no wait, nothing said
    assert slept == [] and told == []
    for _ in range(3):
        await pay(budget, 10.0, told.append, sleep)  # each 10 s at 4x: 2.5 s of debt, waited out
    assert slept == pytest.approx([2.5, 2.5, 2.5])
    assert [e.code for e in told] == [PACED_CODE]  # told once
    with pytest.raises(TooLarge):
        await pay(budget, 31.0, told.append, sleep)  # over the burst: refused before anything is waited
    assert len(slept) == 3


async def test_a_keys_pictures_are_paid_through_the_same_function() -> None:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.stream.budget import pay, pixel_budget
    from lingua_fusion.stream.events import Error

    clock = Clock()
    budget = pixel_budget(LimitSettings(max_key_pixels_per_s=16e6, max_image_pixels=40_000_000), clock)
    told: list[Error] = []
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    await pay(budget, 40e6, told.append, sleep)
    await pay(budget, 40e6, told.append, sleep)
    assert slept == pytest.approx([2.5]) and [e.code for e in told] == ["pictures_paced"]


def test_a_keys_pixel_budget_is_shared_out_over_the_workers() -> None:
    """serve --workers N: each worker paces a key's streams there at 1/N of limits.max_key_pixels_per_s, so the
    key's streams together stay within it wherever they land (api/workers.py shared_out)."""
    from lingua_fusion.api.workers import shared_out
    from lingua_fusion.config import Settings

    s = Settings()
    s.limits.max_key_pixels_per_s = 16e6
    each = shared_out(s, workers=2, model_processes=1)
    assert each.limits.max_key_pixels_per_s == 8e6 and s.limits.max_key_pixels_per_s == 16e6
    assert shared_out(s, workers=4, model_processes=2).models.gpu_memory_share == s.models.gpu_memory_share / 2
