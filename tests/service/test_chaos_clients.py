"""Client faults against a real server: a hung peer and a client that never ends are closed at the idle timeout
(4408); a client that stops reading is closed as a slow consumer (4429) once its event queue is full."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import free_port, start_server, stop_server, talk_wav

from lingua_fusion.lab.chaos.clients import half_open, never_end, slow_reader
from lingua_fusion.sdk.client import ws_url
from lingua_fusion.sdk.stream import start_message

IDLE_S = 3.0
UVICORN_CLOSE_TIMEOUT_S = 10.0  # uvicorn closes TCP this long after its close frame when the peer never answers


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, proc = start_server(tmp_path_factory.mktemp("chaos-clients"), "--no-auth",
                             env={"LINGUAFUSION_SERVER__STREAM_IDLE_TIMEOUT_S": str(IDLE_S)})
    yield ws_url(url)
    stop_server(proc)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A short English sentence as PCM16 LE mono 16 kHz."""
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media import decode_audio

    audio, _ = decode_audio(talk_wav(["Good morning everyone and welcome to the quarterly review."]), LimitSettings())
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def _start(target: str = "es") -> dict[str, object]:
    return start_message([target], "en", "standard", True, 0.5, None, False, 0.4)


async def test_half_open_and_never_end_are_closed_at_the_idle_timeout(idle_server: str, speech: bytes) -> None:
    dead, quiet = await asyncio.gather(half_open(idle_server, None, _start(), seconds=25),
                                       never_end(idle_server, None, _start(), speech, send_s=2, seconds=25))
    # the hung peer: closed with the idle code; its TCP closes after uvicorn's close timeout (no close reply came)
    assert dead["opened"] and "error" not in dead, dead
    assert dead["close_code"] == 4408 and dead["close_reason"] == "idle_timeout", dead
    assert dead["tcp_closed"] and dead["messages_sent"] == 0
    assert IDLE_S <= dead["closed_after_s"] <= IDLE_S + UVICORN_CLOSE_TIMEOUT_S + 3, dead
    assert dead["last_error"] == {"code": "idle_timeout", "message": "no message in time"}
    # the client that never ends: it reads and answers pings, but sends nothing: closed one idle timeout later
    assert quiet["opened"] and "error" not in quiet, quiet
    assert quiet["close_code"] == 4408 and quiet["close_reason"] == "idle_timeout", quiet
    assert quiet["messages_sent"] == 8 and 1.5 <= quiet["last_send_s"] <= 2.5, quiet
    assert IDLE_S - 0.5 <= quiet["closed_after_s"] - quiet["last_send_s"] <= IDLE_S + 2, quiet


async def test_slow_reader_is_closed_as_a_slow_consumer(idle_server: str, speech: bytes) -> None:
    # Captions in quick succession: text messages into the same language (no MT), 30 a second, each ~20 KB of
    # incompressible words so that the socket buffers (~4 MiB of kernel send buffer on loopback, the client
    # library's 16 frames) fill in a few seconds and the server's 256-event queue right after
    text = " ".join(secrets.token_hex(4) for _ in range(2200))  # under the 20,000-character text limit
    out = await slow_reader(idle_server, None, _start("en"), speech, seconds=18, read_after_s=18, texts_per_s=30,
                            text=text)
    assert out["opened"] and "error" not in out, out
    assert out["events_read"] > 0 and out["closed_after_s"] is not None, out
    # 30 captions a second for 18 s (two events each) is far more than the 256-event queue and the socket buffers
    # hold: a normal close would mean the server buffered without bound
    assert out["close_code"] == 4429 and out["close_reason"] == "slow_consumer", out
    assert out["last_error"]["code"] == "slow_consumer", out


async def test_clients_record_network_errors_instead_of_raising() -> None:
    url = f"ws://127.0.0.1:{free_port()}/v1/streams"  # nothing listens there
    outs = await asyncio.gather(half_open(url, "sk_x", _start(), seconds=1),
                                never_end(url, "sk_x", _start(), b"", send_s=1, seconds=1),
                                slow_reader(url, "sk_x", _start(), b"", seconds=1, read_after_s=1))
    for out in outs:
        assert not out["opened"] and out["close_code"] is None and "ConnectionRefused" in out["error"], out
