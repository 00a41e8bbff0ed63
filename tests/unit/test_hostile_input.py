"""Hostile input, by property: mutated and truncated containers never escape as anything but a client error, and
the stream protocol keeps its promises under any order of opens, sends, reorders, duplicates and ends."""

from __future__ import annotations

import asyncio
import io
import wave
from typing import Any

import numpy as np
import pytest
from conftest import encode_audio
from fakes import session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lingua_fusion.config import LimitSettings
from lingua_fusion.errors import ClientError, LinguaFusionError
from lingua_fusion.media import decode_audio, decode_image
from lingua_fusion.stream.protocol import StreamSpec
from lingua_fusion.stream.session import State, StreamSession

LIMITS = LimitSettings(max_media_seconds=30, max_image_pixels=4_000_000)


def _wav(seconds: float = 0.5) -> bytes:
    t = np.arange(int(16000 * seconds)) / 16000
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def _encoded(fmt: str, codec: str) -> bytes:
    return encode_audio(_wav(), fmt, codec)


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), "white").save(buf, format="PNG")
    return buf.getvalue()


SEEDS = {"wav": _wav(), "mp3": _encoded("mp3", "mp3"), "ogg": _encoded("ogg", "libopus"), "png": _png()}


def mutate(data: bytes, cut: float, flips: list[tuple[float, int]]) -> bytes:
    b = bytearray(data[: max(1, int(len(data) * cut))])
    for pos, val in flips:
        b[int(pos * (len(b) - 1))] = val
    return bytes(b)


def _decode(kind: str, data: bytes) -> Any:
    return decode_image(data, LIMITS) if kind == "png" else decode_audio(data, LIMITS)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(SEEDS)), cut=st.floats(0.01, 1.0),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=8))
def test_mutated_containers_fail_only_as_client_errors(kind: str, cut: float, flips: list[tuple[float, int]]) -> None:
    data = mutate(SEEDS[kind], cut, flips)
    try:
        out = _decode(kind, data)
    except LinguaFusionError as exc:
        assert isinstance(exc, ClientError), exc  # a broken file is the client's problem: 4xx, never 5xx
        return
    if kind != "png":
        audio, info = out
        assert audio.dtype == np.float32 and audio.ndim == 1 and info["duration_s"] <= 30


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=2048))
def test_random_bytes_are_client_errors(data: bytes) -> None:
    for kind in ("wav", "png"):
        try:
            _decode(kind, data)
        except LinguaFusionError as exc:
            assert isinstance(exc, ClientError)


class ProtocolMachine(RuleBasedStateMachine):
    """Open / send (in order, reordered, duplicated, with gaps) / text / end, on one session; invariants after
    every step: finals numbered 1..N with no gap and never changed once sent, queues within their bounds."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()

        async def open_stream() -> StreamSession:  # tasks need the running loop
            s = session(spec=StreamSpec(source_lang="en", targets=["es"], partials=False), max_events=10_000)
            s.start()
            return s

        self.session = self.loop.run_until_complete(open_stream())
        self.ts = 0.0
        self.sent: list[tuple[float, bytes]] = []
        self.seen: list[dict[str, Any]] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout=10))

    def collect(self) -> None:
        async def settled() -> None:  # every job the input started has finished (or the session closed)
            while self.session.busy() and not self.session.closed.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0)

        self.run(settled())
        while not self.session.events.empty():
            self.seen.append(self.session.events.get_nowait().to_wire())

    def finals(self) -> int:
        return sum(e["type"] == "final" for e in self.seen)

    @precondition(lambda self: self.session.state == State.LIVE)
    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0]))
    def speak_a_sentence(self, seconds: float) -> None:
        """Speech then a pause longer than the end-of-utterance silence: a caption, always."""
        before = self.finals()
        pcm = np.r_[np.full(int(16000 * seconds), 6000, dtype="<i2"), np.zeros(16000, dtype="<i2")].tobytes()
        self.sent.append((self.ts, pcm))
        self.run(self.session.feed_audio(pcm, self.ts))
        self.ts += seconds + 1.0
        self.collect()
        assert self.finals() > before

    @precondition(lambda self: self.session.state == State.LIVE)
    @rule(loud=st.booleans(), seconds=st.sampled_from([0.25, 0.5, 1.0]), gap=st.sampled_from([0.0, 0.0, 0.3, 1.5]))
    def send_audio(self, loud: bool, seconds: float, gap: float) -> None:
        self.ts += gap
        pcm = (np.full(int(16000 * seconds), 6000 if loud else 0, dtype="<i2")).tobytes()
        self.sent.append((self.ts, pcm))
        self.run(self.session.feed_audio(pcm, self.ts))
        self.ts += seconds
        self.collect()

    @precondition(lambda self: self.session.state == State.LIVE and len(self.sent) > 0)
    @rule(back=st.integers(1, 4))
    def resend_old_chunk(self, back: int) -> None:  # duplicates and late arrivals
        ts, pcm = self.sent[-min(back, len(self.sent))]
        self.run(self.session.feed_audio(pcm, ts))
        self.collect()

    @precondition(lambda self: self.session.state == State.LIVE)
    @rule(text=st.text(min_size=0, max_size=40))
    def send_text(self, text: str) -> None:
        self.run(self.session.feed_text(text))
        self.collect()

    @precondition(lambda self: self.session.state == State.LIVE)
    @rule()
    def end(self) -> None:
        self.run(self.session.end())
        self.run(asyncio.wait_for(self.session.closed.wait(), 10))
        self.collect()

    @precondition(lambda self: self.session.state == State.CLOSED)
    @rule()
    def send_after_close(self) -> None:
        from lingua_fusion.errors import InvalidParameter

        assert self.seen and self.seen[-1]["type"] == "closed"
        with pytest.raises(InvalidParameter):
            self.run(self.session.feed_text("late"))

    @invariant()
    def finals_are_numbered_without_gaps_and_never_change(self) -> None:
        finals = [e for e in self.seen if e["type"] == "final"]
        assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))
        assert all(f["start"] <= f["end"] for f in finals)

    @invariant()
    def queues_stay_bounded(self) -> None:
        assert self.session.events.qsize() <= 10_000 and self.session._pending.qsize() <= 64
        assert len(self.session.timeline.buf) <= self.session.timeline.max_buffer

    def teardown(self) -> None:
        async def settle() -> None:  # close, and let the cancelled tasks finish before the loop closes
            self.session.abort()
            await asyncio.gather(*self.session._tasks, self.session._emitter, return_exceptions=True)

        self.run(settle())
        self.loop.close()


TestProtocol = ProtocolMachine.TestCase
TestProtocol.settings = settings(max_examples=25, stateful_step_count=15, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])


def test_the_seed_files_decode() -> None:
    for kind, data in SEEDS.items():
        _decode(kind, data)  # the mutations start from valid files


@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_empty_file_is_a_client_error(kind: str) -> None:
    with pytest.raises(ClientError):
        _decode(kind, b"")
