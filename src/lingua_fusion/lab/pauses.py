"""A live stream driven through a long pause (issue 32, "silence stays silent"): speech, minutes of non-speech
(lab/nonspeech.py), speech again, over a real WebSocket, as fast as the stream's audio budget lets a client send
(``ready.max_audio_speed``, 4x real time by default: the client paces itself to it so that no audio waits in the
socket's buffers, and the wall clock at which each piece was sent is when the server had it).

What it measures (``Run``'s methods, pure: the events and the send times were recorded): captions invented during
the non-speech (finals with text there), finals withheld there (gated: empty, with the reason), partials shown there,
and how late the first caption of the speech after the pause came, from the moment its last sample was sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..types import SR

CHUNK_S = 0.5


@dataclass(frozen=True)
class Piece:
    kind: str  # "speech", or a kind of lab/nonspeech.py
    audio: np.ndarray  # 16 kHz mono float32


@dataclass(frozen=True)
class Span:
    kind: str
    start: float  # stream seconds
    end: float

    def holds(self, event: dict[str, Any]) -> bool:
        """Does the event's time span lie mostly inside this one (its middle does)?"""
        middle = (float(event.get("start", 0.0)) + float(event.get("end", 0.0))) / 2
        return self.start <= middle < self.end


@dataclass(frozen=True)
class Heard:
    wall: float  # time.monotonic() when it arrived
    event: dict[str, Any]


@dataclass
class Run:
    spans: list[Span]
    events: list[Heard] = field(default_factory=list)
    sent: list[tuple[float, float]] = field(default_factory=list)  # (stream seconds sent up to, wall clock)

    def of(self, kind: str, span: Span) -> list[dict[str, Any]]:
        return [h.event for h in self.events if h.event.get("type") == kind and span.holds(h.event)]

    def invented(self, span: Span) -> list[dict[str, Any]]:
        """Finals with words in a non-speech span: captions made up from what nobody said."""
        return [e for e in self.of("final", span) if e.get("source_text") or e.get("text")]

    def withheld(self, span: Span) -> list[dict[str, Any]]:
        """Finals in the span whose words were withheld (``gated``: empty, with a note saying why)."""
        return [e for e in self.of("final", span) if e.get("gated") and not e.get("source_text")]

    def shown(self, span: Span) -> list[dict[str, Any]]:
        """Partials and revisions with words in the span (tentative, never committed)."""
        return [e for e in self.of("partial", span) + self.of("revision", span) if e.get("source_text")]

    def sent_at(self, t: float) -> float:
        """The wall clock at which the audio up to stream time ``t`` had been sent."""
        for upto, wall in self.sent:
            if upto >= t - 1e-6:
                return wall
        return self.sent[-1][1] if self.sent else 0.0

    def resumed(self, span: Span) -> tuple[dict[str, Any], float] | None:
        """The first final with words over a speech span, and how many seconds after its last sample was sent it
        arrived (None: no caption for it)."""
        for h in self.events:
            e = h.event
            if e.get("type") == "final" and e.get("source_text") and float(e["end"]) > span.start \
                    and float(e["start"]) < span.end:
                return e, h.wall - self.sent_at(span.end)
        return None


def spans_of(pieces: list[Piece]) -> list[Span]:
    out, t = [], 0.0
    for p in pieces:
        out.append(Span(p.kind, t, t + len(p.audio) / SR))
        t += len(p.audio) / SR
    return out


async def drive(ws_url: str, pieces: list[Piece], start: dict[str, Any], headers: dict[str, str] | None = None,
                guard_s: float = 120.0) -> Run:
    """Stream ``pieces`` back to back (PCM16 binary messages of CHUNK_S) with the ``start`` message, paced at the
    stream's audio budget; collect every event until ``closed`` (at most ``guard_s`` after the last audio)."""
    from websockets.asyncio.client import connect

    run = Run(spans_of(pieces))
    pcm = (np.clip(np.concatenate([p.audio for p in pieces]), -1, 1) * 32767).astype("<i2").tobytes()
    async with connect(ws_url, additional_headers=headers or {}, open_timeout=guard_s, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", **start}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), guard_s))
        if ready.get("type") != "ready":
            raise RuntimeError(f"the stream did not open: {ready}")
        speed = float(ready.get("max_audio_speed") or 1.0)

        async def read() -> None:
            async for msg in ws:
                event = json.loads(msg)
                run.events.append(Heard(time.monotonic(), event))
                if event.get("type") == "closed":
                    return

        reader = asyncio.create_task(read())
        step = int(CHUNK_S * SR) * 2
        t0 = time.monotonic()
        for i in range(0, len(pcm), step):
            ahead = t0 + i / 2 / SR / speed - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            await ws.send(pcm[i:i + step])
            run.sent.append((min(len(pcm), i + step) / 2 / SR, time.monotonic()))
        await ws.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(reader, guard_s)
    return run
