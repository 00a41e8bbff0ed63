"""A live stream's lips fused with its speech, through the consumer's real parts (sampler, bounded queue, spotting,
fusion) with a test extractor that answers each frame with a synthetic lip landmark frame: speech confirmed or
corrected by the lips, speech below the stream's threshold giving way to the lips, lips that speak while the audio
is silent or gone becoming captions of their own, and video that drops out costing no wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from lingua_fusion.stream.events import Final
from lingua_fusion.video.frames import VideoFrame
from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.landmarks import LandmarkFrame
from lingua_fusion.vision.recogniser import Recogniser
from lingua_fusion.vision.stream_lips import StreamLips

# three words the mouth says differently: (opening, width) shapes passed through, from rest to rest
WORDS = [syn.LipSpec("yes", np.array([[0.05, 1.0], [0.55, 1.0], [0.3, 1.2], [0.05, 1.0]])),
         syn.LipSpec("no", np.array([[0.05, 1.0], [0.45, 0.8], [0.1, 1.0], [0.45, 0.8], [0.05, 1.0]])),
         syn.LipSpec("stop", np.array([[0.05, 1.0], [0.2, 1.3], [0.6, 0.9], [0.05, 1.0]]))]
FPS = 15.0
NOISE = 0.0015  # landmark jitter (image units): about a tracked face mesh's


def _teach() -> Recogniser:
    rng = np.random.default_rng(1)
    return Recogniser.teach("lip", [(w.gloss, syn.perform_lips(w, syn.random_performance(rng, noise=NOISE), rng))
                                    for w in WORDS for _ in range(3)])


def _timeline(said: list[tuple[float, str]], until: float, seed: int = 5) -> dict[float, LandmarkFrame]:
    """Lip frames at FPS from 0 to ``until``: the mouth at rest, and each (start, word) said once."""
    rng = np.random.default_rng(seed)
    rest = syn.LipSpec("rest", np.array([[0.05, 1.0], [0.05, 1.0]]))
    frames: dict[float, LandmarkFrame] = {}
    quiet = syn.perform_lips(rest, syn.Performance(duration=until, fps=FPS, noise=NOISE), rng)
    for f in quiet.frames():
        frames[round(f.t, 3)] = f
    for start, word in said:
        spec = next(w for w in WORDS if w.gloss == word)
        seq = syn.perform_lips(spec, syn.Performance(duration=1.0, fps=FPS, noise=NOISE), rng, t0=start)
        for f in seq.frames():
            frames[round(f.t, 3)] = LandmarkFrame(round(f.t, 3), f.hands, f.hand_present, f.pose, f.pose_present,
                                                  f.lips, f.lips_present)
    return dict(sorted(frames.items()))


@dataclass
class Spec:
    stream_id: str = "st_test"
    min_confidence: float = 0.4
    targets: list[str] = field(default_factory=lambda: ["en"])
    source_lang: str = "en"


class Jobs:
    """The one part of StreamJobs the consumer calls: translate (here: the source text, as for target == source)."""

    def __init__(self) -> None:
        self.spec = Spec()

    async def translate(self, text: str, start: float, end: float, *, confidence: float, wall_ref: float,
                        modality: str = "audio") -> Final:
        return Final(start=start, end=end, source_text=text, text=text, translations={"en": text},
                     confidence=confidence, wall_ref=wall_ref, modality=modality)


@dataclass
class Rig:
    lips: StreamLips
    frames: dict[float, LandmarkFrame]
    finals: list[Coroutine[Any, Any, Final | None]]
    events: list[Any]
    heard: list[tuple[float, float | None, bool]]
    tasks: set[asyncio.Task[Any]]

    async def play(self, until: float | None = None) -> None:
        last = 0.0
        for t in self.frames:
            if until is not None and t > until:
                break
            self.lips.offer(VideoFrame(t, np.full((8, 8, 3), 100, np.uint8)))
            last = t
            await asyncio.sleep(0)
            for _ in range(400):  # a camera in real time: the extractor keeps up
                if len(self.lips._queue) <= 2:
                    break
                await asyncio.sleep(0.005)
        for _ in range(400):
            if self.lips._analysed_t >= last - 0.2 and not self.lips._queue:
                return
            await asyncio.sleep(0.01)

    async def captions(self) -> list[Final]:
        return [f for f in [await c for c in self.finals] if f is not None]


def _rig(said: list[tuple[float, str]], until: float, heard: tuple[float, float | None, bool]) -> Rig:
    frames = _timeline(said, until)
    finals: list[Coroutine[Any, Any, Final | None]] = []
    events: list[Any] = []
    tasks: set[asyncio.Task[Any]] = set()
    state = [heard]

    def spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    def extract(t: float, rgb: np.ndarray) -> LandmarkFrame:
        return frames[round(t, 3)]

    lips = StreamLips(_teach(), extract, Jobs(), events.append, spawn, finals.append, lambda: state[0],
                      asyncio.get_running_loop())
    return Rig(lips, frames, finals, events, state, tasks)


pytestmark = pytest.mark.timeout(60)


async def test_lips_that_saw_the_spoken_word_confirm_the_final() -> None:
    rig = _rig([(1.0, "stop")], 3.0, (3.0, 0.7, True))  # speech from 0.7 s, still open: nothing said alone
    await rig.play()
    cap = await rig.lips.fuse("Please stop now", 0.8, 0.7, 2.4)
    assert cap is not None and cap.text == "Please stop now" and cap.modalities == ("audio", "lips")
    assert cap.confidence > 0.8


async def test_a_doubtful_word_the_lips_contradict_is_replaced() -> None:
    rig = _rig([(1.0, "stop")], 3.0, (3.0, 0.7, True))
    await rig.play()
    cap = await rig.lips.fuse("say yes", 0.5, 0.7, 2.4)  # above the stream's 0.4, below the 0.6 of a sure word
    assert cap is not None and cap.text == "say stop" and cap.replaced == (("yes", "stop"),)
    sure = await rig.lips.fuse("say yes", 0.9, 0.7, 2.4)
    assert sure is not None and sure.text == "say yes"  # the ASR was sure of it: kept, the lips only lower it


async def test_speech_below_the_streams_threshold_gives_way_to_the_lips() -> None:
    rig = _rig([(1.0, "no")], 3.0, (3.0, 0.7, True))
    await rig.play()
    cap = await rig.lips.fuse("mm hm", 0.2, 0.7, 2.4)
    assert cap is not None and cap.text == "no" and cap.modalities == ("lips",)
    none = await rig.lips.fuse("", 0.0, 0.7, 2.4)  # no words from ASR at all
    assert none is not None and none.text == "no" and none.modalities == ("lips",)


async def test_lips_moving_in_silence_make_a_caption_of_their_own() -> None:
    rig = _rig([(1.0, "stop"), (3.0, "yes")], 5.0, (9.0, None, True))  # the audio went on: silence, no speech
    await rig.play()
    await rig.lips.finish(10.0)
    caps = await rig.captions()
    assert [(c.source_text, c.to_wire()["modalities"]) for c in caps] == [("stop", ["lips"]), ("yes", ["lips"])]
    assert 0.9 <= caps[0].start <= 1.3 and caps[0].end <= 2.1  # on the stream's timeline where the mouth moved
    assert rig.lips.stats().analysed < rig.lips.stats().decoded  # sampled within the budget


async def test_a_movement_inside_an_utterance_is_left_to_that_utterance() -> None:
    rig = _rig([(1.0, "stop")], 3.0, (9.0, None, True))
    rig.lips.claim(0.8, 2.3)  # the utterance was committed: its final fuses these lips
    await rig.play()
    await rig.lips.finish(10.0)
    assert await rig.captions() == []


async def test_when_the_audio_stops_arriving_the_lips_still_caption() -> None:
    rig = _rig([(1.0, "no")], 3.0, (0.5, None, True))  # audio heard until 0.5 s, then nothing more
    t0 = time.monotonic()
    await rig.play()
    for _ in range(100):
        if rig.finals:
            break
        await asyncio.sleep(0.1)
    caps = await rig.captions()
    assert [c.source_text for c in caps] == ["no"] and time.monotonic() - t0 < 8


async def test_when_the_video_drops_out_the_final_is_speech_alone_without_waiting() -> None:
    rig = _rig([(1.0, "stop")], 3.0, (9.0, 0.7, True))
    await rig.play(until=2.5)  # the camera stopped at 2.5 s
    await asyncio.sleep(0.6)
    t0 = time.monotonic()
    assert await rig.lips.fuse("and then go", 0.9, 4.0, 5.5) is None  # no lips there: the caller keeps the speech
    assert time.monotonic() - t0 < 0.3
