"""The speed bounds the test suite used to assert, measured here instead (a slow machine must not fail a correct
build; a regression in speed shows here, with the figure):

- caption latency of a live interactive stream (the CLI, ``--realtime``): every caption under 5 s after its audio;
- cross-stream batching: 4 concurrent streams share some Whisper batches (a batch of more than one utterance);
- the chaos proxy: 10 pipelined chunks through a 0.3 s "slow" proxy arrive within 2 s (not serialised); a round
  trip in "pass" mode under 0.3 s; a client of a proxy whose upstream is down is closed within 1 s;
- an absurd WAV sample rate (1.7 GHz, 1 Hz) refused within 2 s (before resampling: it took 25 s and 1.8 GB).

    .venv/bin/python bench/speed_bounds.py --json bench/results/speed_bounds.json   (exit 1 when a bound fails)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

SENTENCES = ["Good morning everyone and welcome to the quarterly review.", "The new office will open in the spring.",
             "Our team finished the project on time."]


def bound(name: str, value: float, limit: float, unit: str = "s", *, below: bool = True) -> dict[str, Any]:
    ok = value < limit if below else value > limit
    return {"name": name, "value": round(value, 3), "bound": f"{'<' if below else '>'} {limit} {unit}", "ok": ok}


# ---- the chaos proxy ------------------------------------------------------------------------------------------------
async def proxy_bounds() -> list[dict[str, Any]]:
    from conftest import free_port

    from lingua_fusion.lab.chaos.proxy import TcpProxy

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = TcpProxy("127.0.0.1", int(server.sockets[0].getsockname()[1]))
    out = []
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.start())
        proxy.set_mode("slow", delay_s=0.3)
        t = time.monotonic()
        for i in range(10):
            writer.write(b"%02d" % i)
            await writer.drain()
            await asyncio.sleep(0.02)
        await asyncio.wait_for(reader.readexactly(20), timeout=30)
        out.append(bound("proxy slow 0.3 s: 10 pipelined chunks back", time.monotonic() - t, 2.0))
        proxy.set_mode("pass")
        t = time.monotonic()
        writer.write(b"fast")
        await writer.drain()
        await asyncio.wait_for(reader.readexactly(4), timeout=30)
        out.append(bound("proxy pass: one round trip", time.monotonic() - t, 0.3))
        writer.close()
    finally:
        proxy.stop()
        server.close()
    down = TcpProxy("127.0.0.1", free_port())
    try:
        port = down.start()
        t = time.monotonic()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            try:
                await asyncio.wait_for(r.read(1), timeout=30)
            except (ConnectionResetError, BrokenPipeError):
                pass
            w.close()
        except ConnectionError:
            pass
        out.append(bound("proxy with upstream down: client closed", time.monotonic() - t, 1.0))
    finally:
        down.stop()
    return out


# ---- media ----------------------------------------------------------------------------------------------------------
def media_bounds() -> list[dict[str, Any]]:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.errors import CorruptMedia
    from lingua_fusion.media import decode_audio

    out = []
    for rate in (1_711_292_032, 1):
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(b"\x01\x00" * 8)
        t = time.monotonic()
        try:
            decode_audio(buf.getvalue(), LimitSettings())
        except CorruptMedia:
            pass
        out.append(bound(f"WAV at {rate} Hz refused", time.monotonic() - t, 2.0))
    return out


# ---- live streams ---------------------------------------------------------------------------------------------------
def stream_bounds() -> list[dict[str, Any]]:
    from conftest import BIN, start_server, stop_server, talk_wav

    tmp = Path(tempfile.mkdtemp())
    talk = tmp / "talk.wav"
    talk.write_bytes(talk_wav(SENTENCES))
    url, proc = start_server(tmp, "--no-auth")
    out = []
    try:
        p = subprocess.run([str(BIN), "stream", str(talk), "--to", "es", "--realtime", "--json", "--url", url,
                            "--slo", "interactive"], capture_output=True, text=True, timeout=300, check=True)
        finals = [e for e in map(json.loads, p.stdout.splitlines()) if e["type"] == "final"]
        out.append(bound("interactive caption latency, worst of the talk (client-measured)",
                         max(f["latency_s"] for f in finals), 5.0))
        asyncio.run(_four_streams(url, talk.read_bytes()))
        import httpx

        metrics = httpx.get(url + "/metrics", timeout=10).text
        count = _metric(metrics, 'linguafusion_batch_size_count{model="asr:tiny.en"}')
        ones = _metric(metrics, 'linguafusion_batch_size_bucket{le="1.0",model="asr:tiny.en"}')
        out.append(bound("Whisper batches holding more than one utterance (4 streams)", count - ones, 0,
                         "batches", below=False))
    finally:
        stop_server(proc)
    return out


async def _four_streams(url: str, wav: bytes) -> None:
    from lingua_fusion import MultimodalTranslator
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media import decode_audio

    audio, _ = decode_audio(wav, LimitSettings())
    pcm = (audio.clip(-1, 1) * 32767).astype("<i2").tobytes()
    t = MultimodalTranslator(base_url=url)

    async def one() -> None:
        async with t.stream(["es"], partials=False, slo="batch") as s:
            await s.send_audio(pcm, ts=0.0)
            await s.end()
            async for _ev in s:
                pass

    await asyncio.gather(*(one() for _ in range(4)))


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = asyncio.run(proxy_bounds()) + media_bounds() + stream_bounds()
    for r in results:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['name']}: {r['value']} ({r['bound']})")
    report = {"machine": f"{platform.machine()}, {platform.python_version()}", "bounds": results,
              "all_ok": all(r["ok"] for r in results)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if report["all_ok"] else 1)


if __name__ == "__main__":
    main()
