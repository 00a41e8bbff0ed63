"""A long talk for the long-session proofs (``bench/long_session.py``, ``tests/service/test_long_session.py``): a few
synthesised sentences, spoken in a seeded order with pauses between them (and a long pause every few minutes, a
break), for as long as asked; and ``feed``, which sends it to a stream as fast as the stream's audio budget lets
it (stream/budget.py: 4x real time by default).

``feed`` holds back when too much of its speech is not captioned yet. The server's ingest takes 4x real time, and
a server that captions slower than that queues commits until the stream is closed ``overloaded`` (stream/finals.py:
64 pending). A long-session proof measures what a session keeps and how late its captions come over hours, not
the machine's throughput knee, so the talk keeps at most ``max_pending_s`` seconds of its speech uncaptioned, and
says how often and how long it waited (none at all when the server kept up).
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from ..stream.budget import Bucket
from ..types import SR

PAUSES_S = (0.8, 1.0, 1.5, 2.5)  # between sentences (the commit policy ends an utterance after 0.6 s of silence)
PACE_SHARE = 0.9  # of the server's audio budget the talk uses, as the SDK does (sdk/stream.py ``_pace``)


@dataclass(frozen=True)
class Piece:
    """One sentence, or one pause (``sentence`` -1), from sample ``start`` of the stream, ``n`` samples long."""

    start: int
    n: int
    sentence: int

    @property
    def end(self) -> int:
        return self.start + self.n


def plan_talk(lengths: list[int], total_s: float, *, seed: int = 0, break_every_s: float = 300.0,
              break_s: float = 30.0) -> list[Piece]:
    """Sentences of ``lengths`` samples in a seeded order (each round a new shuffle), a pause of one of
    ``PAUSES_S`` after each, and a pause of ``break_s`` every ``break_every_s`` (0: none), until ``total_s``."""
    rng = random.Random(seed)
    out: list[Piece] = []
    pos, total, next_break = 0, int(total_s * SR), break_every_s * SR
    order: list[int] = []
    while pos < total:
        if not order:
            order = list(range(len(lengths)))
            rng.shuffle(order)
        i = order.pop()
        out.append(Piece(pos, lengths[i], i))
        pos += lengths[i]
        pause = rng.choice(PAUSES_S)
        if break_every_s and pos >= next_break:
            pause, next_break = break_s, next_break + break_every_s * SR
        out.append(Piece(pos, int(pause * SR), -1))
        pos += int(pause * SR)
    return out


class SpeechClock:
    """How many seconds of a plan's speech lie before a stream time (bisect over the pieces: O(log n))."""

    def __init__(self, plan: list[Piece]) -> None:
        speech = [p for p in plan if p.sentence >= 0]
        self._starts = [p.start for p in speech]
        self._pieces = speech
        self._before = np.concatenate([[0], np.cumsum([p.n for p in speech])]).tolist()

    def before(self, t: float) -> float:
        sample = int(t * SR)
        i = bisect.bisect_right(self._starts, sample)  # pieces starting before t: all but the last are whole
        if i == 0:
            return 0.0
        last = self._pieces[i - 1]
        return (self._before[i - 1] + min(last.n, sample - last.start)) / SR

    def pending(self, sent_s: float, captioned_s: float) -> float:
        """Speech sent and not yet captioned (seconds)."""
        return max(0.0, self.before(sent_s) - self.before(captioned_s))


@dataclass
class FeedStats:
    """What ``feed`` did so far (read while it runs: the benchmark samples it)."""

    sent_s: float = 0.0  # stream time sent up to
    chunks: int = 0
    waits: int = 0  # chunks held back because too much speech was not captioned yet
    waited_s: float = 0.0


Send = Callable[[bytes, float], Awaitable[None]]


async def feed(plan: list[Piece], pcms: list[bytes], send: Send, captioned: Callable[[], float], *, speed: float,
               burst_s: float, chunk_s: float = 0.5, max_pending_s: float = 30.0, max_hold_s: float = 30.0,
               from_s: float = 0.0, stats: FeedStats | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> FeedStats:
    """Send ``plan`` from stream time ``from_s`` in chunks of ``chunk_s`` (``send(pcm16, ts)``), paced under the
    stream's budget (``speed``, ``burst_s`` from its ``ready``), never more than ``max_pending_s`` of speech ahead
    of ``captioned()`` (the end of the latest final, stream s), unless no caption came for ``max_hold_s``: speech
    that gives no final (Whisper heard nothing) must not hold the talk for ever."""
    stats = stats or FeedStats()
    budget = Bucket(PACE_SHARE * speed, PACE_SHARE * burst_s, clock)
    speech = SpeechClock(plan)
    step, first = int(chunk_s * SR), int(from_s * SR)
    for piece in plan:
        if piece.end <= first:
            continue
        pcm = pcms[piece.sentence] if piece.sentence >= 0 else bytes(2 * piece.n)
        for a in range(max(0, first - piece.start), piece.n, step):
            b = min(piece.n, a + step)
            t0, held = clock(), False
            while speech.pending((piece.start + b) / SR, captioned()) > max_pending_s and clock() - t0 < max_hold_s:
                held = True
                await sleep(0.05)
            if held:
                stats.waits += 1
                stats.waited_s += clock() - t0
            if (wait := budget.charge((b - a) / SR)) > 0:
                await sleep(wait)
            await send(pcm[2 * a: 2 * b], (piece.start + a) / SR)
            stats.sent_s, stats.chunks = (piece.start + b) / SR, stats.chunks + 1
    return stats


def sentence_pcm(sentences: list[str]) -> list[bytes]:
    """Each sentence spoken by Piper (the same voice and timing every run), as PCM16 LE mono 16 kHz."""
    from ..models.tts import PiperTTS

    tts = PiperTTS(varied=False)
    out = []
    for s in sentences:
        pcm, sr = tts.synthesize(s, language="en")
        audio = pcm.astype(np.float32) / 32768
        if sr != SR:
            n = int(len(audio) * SR / sr)
            audio = np.interp(np.linspace(0, len(audio) - 1, n), np.arange(len(audio)), audio)
        out.append((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return out
