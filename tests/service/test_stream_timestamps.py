"""A live stream's audio timestamps on a real server and WebSocket: a negative ``ts`` is refused with an error
event (the stream goes on); audio whose ``ts`` runs backward (dropped as late, or written over audio already
received) is told to the client while it streams, once for the first such chunk and again every 50th, not per chunk;
chunks reordered into a gap are not. Found by an attack on a live server: both used to be silent until ``closed``."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from conftest import Server
from test_security import ending
from websockets.asyncio.client import connect

from lingua_fusion.errors import InvalidParameter
from lingua_fusion.stream.ingest import BACKWARD_NOTICE_EVERY, AudioTimeline, backward_notice
from lingua_fusion.stream.protocol import check_ts

GUARD_S = 60.0
CHUNK_S = 0.25


def _audio(ts: float, seconds: float = CHUNK_S) -> str:
    pcm = np.zeros(int(seconds * 16000), dtype="<i2").tobytes()  # silence: no speech, no model work but the VAD
    return json.dumps({"type": "audio", "data": base64.b64encode(pcm).decode(), "ts": ts})


async def _open(server: Server) -> Any:
    ws = await connect(server.url.replace("http://", "ws://") + "/v1/streams", open_timeout=GUARD_S,
                       additional_headers={"Authorization": f"Bearer {server.admin_key}"})
    await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": False,
                              "inputs": ["audio"]}))
    ready = json.loads(await asyncio.wait_for(ws.recv(), GUARD_S))
    assert ready["type"] == "ready", ready
    return ws


async def _end(ws: Any) -> tuple[list[dict[str, Any]], int | None]:
    """Send ``end``; the events left until the server closes, and its close code."""
    await ws.send(json.dumps({"type": "end"}))
    return await ending(ws)


async def test_a_negative_ts_is_an_error_event_and_the_stream_goes_on(server: Server) -> None:
    ws = await _open(server)
    await ws.send(_audio(0.0))
    await ws.send(_audio(-1.5))
    err = json.loads(await asyncio.wait_for(ws.recv(), GUARD_S))  # told at once, not at the close
    assert err["type"] == "error" and err["code"] == "invalid_parameter", err
    assert "must not be negative" in err["message"] and err["details"] == {"field": "ts", "ts": -1.5}
    await ws.send(_audio(CHUNK_S))
    events, code = await _end(ws)
    assert [e["type"] for e in events] == ["closed"] and code == 1000


async def test_audio_whose_clock_runs_backward_is_told_live_once_per_50_chunks(server: Server) -> None:
    ws = await _open(server)
    for i in range(12):  # 3 s of audio, in order
        await ws.send(_audio(i * CHUNK_S))
    await ws.send(_audio(0.0))  # the clock restarted: 3 s behind, older than the 2 s reorder window
    err = json.loads(await asyncio.wait_for(ws.recv(), GUARD_S))  # told at once, not at the close
    assert err["type"] == "error" and err["code"] == "invalid_parameter", err
    assert "dropped" in err["message"] and "ts must grow with the audio" in err["message"]
    assert err["details"] == {"field": "ts", "ts": 0.0, "behind_s": 3.0, "dropped": True, "late_dropped": 1,
                              "overlapped": 0}
    for _ in range(BACKWARD_NOTICE_EVERY):  # then the clock stuck: every chunk lands over the previous one
        await ws.send(_audio(11 * CHUNK_S))
    events, code = await _end(ws)
    errors = [e for e in events if e["type"] == "error"]
    # backward chunks 2..50 said nothing; the 51st did, with the counts so far
    assert len(errors) == 1, errors
    assert errors[0]["details"] == {"field": "ts", "ts": 2.75, "behind_s": 0.25, "dropped": False,
                                    "late_dropped": 1, "overlapped": BACKWARD_NOTICE_EVERY}
    assert "written over that audio" in errors[0]["message"]
    closed = events[-1]
    assert closed["type"] == "closed" and code == 1000
    assert closed["timeline"]["late_dropped"] == 1 and closed["timeline"]["overlapped"] == BACKWARD_NOTICE_EVERY


async def test_chunks_reordered_into_a_gap_are_not_told(server: Server) -> None:
    ws = await _open(server)
    order = [0, 1, 3, 2, 4, 6, 5, 7]  # two pairs swapped: each late chunk fills the gap its twin left
    for i in order:
        await ws.send(_audio(10.0 + i * CHUNK_S))
    events, code = await _end(ws)
    assert [e["type"] for e in events if e["type"] == "error"] == []
    assert events[-1]["timeline"] == {"late_dropped": 0, "reordered": 2, "overlapped": 0, "gap_seconds": 0.5}
    assert code == 1000


# ---- the pure parts ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ts", [-0.001, -1e9])
def test_check_ts_refuses_a_negative_timestamp(ts: float) -> None:
    with pytest.raises(InvalidParameter, match="must not be negative"):
        check_ts(ts)
    assert check_ts(0) == 0.0 and check_ts(1.7e9) == 1.7e9 and check_ts(None) is None


def test_the_backward_notice_is_said_for_the_first_chunk_then_every_50th() -> None:
    tl = AudioTimeline()
    said = [n for n in range(1, 200) if backward_notice(1.0, 2.5, True, n, tl) is not None]
    assert said == [1, 51, 101, 151]


def test_the_timeline_counts_audio_written_over_received_audio_not_into_a_gap() -> None:
    tl = AudioTimeline()
    one = np.ones(4000, dtype=np.float32)  # 0.25 s
    assert tl.write(one, 0.0) and tl.write(one, 0.5)  # a 0.25 s gap
    assert tl.write(one, 0.25) and tl.stats.overlapped == 0 and tl.gaps == []  # fills the gap exactly
    assert tl.write(one, 0.25) and tl.stats.overlapped == 1  # the same again: over received audio
    assert tl.write(one, 0.7495) and tl.stats.overlapped == 1  # 0.5 ms early: a rounded ts, not an overlap
    assert tl.write(one, 1.5) and tl.gaps == [(15992, 24000)]
    assert tl.write(one, 1.375) and tl.stats.overlapped == 2  # half into the gap, half over received audio
    assert tl.gaps == [(15992, 22000)]
    assert tl.write(one, 1.0) and tl.stats.overlapped == 2  # inside the gap
    assert tl.gaps == [(15992, 16000), (20000, 22000)] and tl.stats.reordered == 5
