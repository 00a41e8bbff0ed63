"""Shared fixtures: real models, a real uvicorn server on a free port, synthetic speech and slides."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

# The tests test this checkout's code: its src/ goes first on the path, here and in every subprocess (servers, the
# CLI), whatever an editable install in the virtual environment points at (a copy of the tree run with another
# checkout's venv would otherwise test that other checkout).
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])

import lingua_fusion  # noqa: E402
from lingua_fusion.config import Settings  # noqa: E402
from lingua_fusion.files import FileTranslator  # noqa: E402

assert Path(lingua_fusion.__file__).resolve().is_relative_to(SRC), \
    f"the tests import {lingua_fusion.__file__}, not this checkout's {SRC}"

# scripts/watchdog.sh (CI) asks every stuck Python process for its stacks with SIGUSR1 when py-spy is not there
faulthandler.register(signal.SIGUSR1, all_threads=True)

BIN = Path(sys.executable).parent / "linguafusion"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

# Under CI (.ci/run; CI=true) nothing may be skipped: a test that needs Redis or an optional extra that is not there
# fails, so a green CI means every test ran. Elsewhere such tests skip, saying what they need.
UNDER_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

# the real redis-server that `make test` (scripts/with-redis.sh) starts; the Redis cases need it
REDIS = os.environ.get("LINGUAFUSION_TEST_REDIS_URL")
needs_redis = pytest.mark.skipif(REDIS is None, reason="needs the redis-server that `make test` starts")


def pytest_configure(config: pytest.Config) -> None:
    """A crashed xdist worker (a segfault in native code) fails its own test and the run goes on (xdist_guard.py).
    Runs before xdist's own configure (trylast), which reads the restart option."""
    import xdist_guard

    xdist_guard.install(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if UNDER_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must run every test: {reason}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI, a module skipped at collection (a missing extra: importorskip) fails the run too."""
    if not UNDER_CI:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []  # test skips failed already
    if skipped:
        for r in skipped:
            print(f"\nskipped under CI, which must run every test: {r.nodeid}: {r.longrepr}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileTranslator]:
    s = Settings()
    s.state_dir = tmp_path_factory.mktemp("engine-state")
    e = FileTranslator(s)
    yield e
    e.close()


@dataclass
class Server:
    url: str
    admin_key: str
    state_dir: Path
    proc: subprocess.Popen[bytes]

    def key(self, *args: str) -> str:
        out = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(self.state_dir), *args],
                             capture_output=True, text=True, timeout=60, check=True)
        return out.stdout.strip()


@contextlib.asynccontextmanager
async def serve_in_loop(settings: Settings, wait_s: float = 30.0) -> AsyncIterator[tuple[str, Any]]:
    """A real server (uvicorn, the app of ``create_app``) in this event loop: (host:port, app); ``wait_s`` bounds
    its start and its stop."""
    import uvicorn

    from lingua_fusion.api import create_app

    app = create_app(settings, warm=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(wait_s):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers no event for it)
                await asyncio.sleep(0.02)
        yield f"127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, wait_s)


def start_server(state_dir: Path, *extra: str, env: dict[str, str] | None = None,
                 port: int | None = None, new_session: bool = False) -> tuple[str, subprocess.Popen[bytes]]:
    """``serve`` on ``port`` (a free one by default), its output in ``state_dir/server-PORT.log``; ready when this
    returns. ``new_session``: in a process group of its own, which a test may signal as a whole."""
    port = port or free_port()
    log = open(state_dir / f"server-{port}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--state-dir",
                             str(state_dir), "--log-level", "warning", *extra], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, start_new_session=new_session)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((state_dir / f"server-{port}.log").read_text())
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return url, proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not become ready in 120 s")


def read_until_closed(s: socket.socket) -> bytes:
    """Everything a raw socket receives until the server closes it (a reset counts as closed)."""
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while data := s.recv(4096):
            got += data
    return got


def metric(text: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels, as /metrics prints them) in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = tmp_path_factory.mktemp("server-state")
    admin = subprocess.run([str(BIN), "keys", "create", "--admin", "--state-dir", str(state)], capture_output=True,
                           text=True, timeout=60, check=True).stdout.strip()
    url, proc = start_server(state)
    yield Server(url, admin, state, proc)
    stop_server(proc)


@pytest.fixture(autouse=True)
def _breaker_restored(request: pytest.FixtureRequest) -> None:
    """Each test on the shared server starts with its SLO breakers at level 0: a test before it on a loaded CI
    machine may have left a class degraded (refusing new streams for the breaker's quiet period), and that is the
    earlier test's state, not this one's behaviour (DELETE /v1/admin/breaker, an admin route)."""
    if "server" not in request.fixturenames:
        return
    server: Server = request.getfixturevalue("server")
    r = httpx.delete(server.url + "/v1/admin/breaker", headers={"Authorization": f"Bearer {server.admin_key}"},
                     timeout=10)
    r.raise_for_status()


# ---- synthetic media ------------------------------------------------------------------------------------------
def piper_wav(text: str) -> bytes:
    from lingua_fusion.models.tts import to_wav

    pcm, sr = _piper().synthesize(text, language="en")
    return to_wav(pcm, sr)


_PIPER: list[object] = []


def _piper():  # type: ignore[no-untyped-def]
    from lingua_fusion.models.tts import PiperTTS

    if not _PIPER:
        _PIPER.append(PiperTTS(varied=False))  # the same speech every run
    return _PIPER[0]


def espeak_wav(text: str, voice: str = "en-us", *args: str) -> bytes:
    """espeak-ng's speech; ``args``: more of its options (``-g 5``: a gap of 50 ms between words)."""
    return subprocess.run(["espeak-ng", "-v", voice, *args, "--stdout", text], capture_output=True, check=True,
                          timeout=60).stdout


def encode_audio(wav: bytes, container: str, codec: str, rate: int = 16000) -> bytes:
    """Re-encode a WAV into another container/codec with PyAV (mp3, m4a/aac, ogg/opus, flac, webm/opus)."""
    import av

    src = av.open(io.BytesIO(wav))
    out_buf = io.BytesIO()
    dst = av.open(out_buf, mode="w", format=container)
    stream = dst.add_stream(codec, rate=rate if codec != "libopus" else 48000)
    stream.layout = "mono"
    resampler = av.AudioResampler(format=stream.format.name if stream.format else "s16", layout="mono",
                                  rate=stream.rate)
    for frame in src.decode(audio=0):
        for f in resampler.resample(frame):
            for packet in stream.encode(f):
                dst.mux(packet)
    for packet in stream.encode(None):
        dst.mux(packet)
    dst.close()
    src.close()
    return out_buf.getvalue()


def render_slide(lines: list[str], size: tuple[int, int] = (1280, 720), fmt: str = "PNG") -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.truetype(FONT, 48)
    y = 80
    for line in lines:
        draw.text((80, y), line, fill="black", font=font)
        y += 90
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def silence_wav(seconds: float, rate: int = 16000) -> bytes:
    from lingua_fusion.models.tts import to_wav

    return to_wav(np.zeros(int(seconds * rate), dtype=np.int16), rate)


def talk_wav(sentences: list[str], pause_s: float = 0.6) -> bytes:
    """Sentences spoken by Piper with a pause between them, as in a talk (Piper alone pauses only ~0.2 s)."""
    import wave

    from lingua_fusion.models.tts import to_wav

    parts: list[np.ndarray] = []
    rate = 22050
    for s in sentences:
        with wave.open(io.BytesIO(piper_wav(s))) as w:
            rate = w.getframerate()
            parts.append(np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16))
        parts.append(np.zeros(int(pause_s * rate), dtype=np.int16))
    return to_wav(np.concatenate(parts), rate)
