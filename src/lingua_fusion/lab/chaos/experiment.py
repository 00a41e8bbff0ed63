"""Chaos experiments as code: ``linguafusion chaos run experiment.yaml``.

The runner starts the server itself (so it can kill and restart it on the same port with the same state store),
optionally runs the load once without faults (the baseline), then runs it again while the experiment's faults fire
on their schedule, and writes one JSON (and HTML) report with both runs, the fault log and the integrity counts
(committed captions lost / duplicated). See examples/chaos/ and docs/reliability.md.

Faults (``kind``), each fired ``at`` seconds after the load's first stream:
  model_delay     {model: asr|mt|ocr|tts|*, delay_s, fraction, jitter_s}   via /v1/admin/faults (needs --chaos)
  model_fault     {model, fault: error|hang|garbage|delay, fraction, after, delay_s}   a broken model backend
  clear_faults    {}
  kill_server     {}                    SIGKILL, then restart on the same port and state directory
  term_server     {}                    SIGTERM (graceful drain), then restart
  audio_noise     {level: SNR dB}       for the whole run: the streams' audio carries white noise
  audio_dropout   {level: gaps per s}   for the whole run: 120-480 ms gaps
  frame_drops     {level: 0.05-0.25}    for the whole run: each slide frame dropped with this probability
  slide_blur      {level: radius px}    for the whole run: slides Gaussian-blurred
  slide_offset    {level: px}           for the whole run: slides shifted left (a moved camera)
  redis_kill      {down_s}              SIGKILL redis-server, restart it on its append-only file after down_s
  redis_slow      {delay_s, for_s}      every byte to and from Redis late by delay_s (through the TCP proxy)
  redis_partition {for_s}               Redis unreachable: connections hang, nothing gets through
  slow_reader     {count, for_s, read_after_s, texts_per_s}   extra clients that send but do not read events
  half_open       {count, for_s}        extra clients that open a stream and go silent (a dead peer)
  never_end       {count, send_s, for_s}   extra clients that send audio, then neither send more nor end

The redis_* faults need ``store: redis`` in the experiment: the runner then starts its own redis-server (AOF on)
behind a TCP proxy it controls (chaos/proxy.py) and points the server's stream log at the proxy. Client faults run
beside the load; their outcome (how and when the server closed them) goes into the fault log, and the load's
goodput against the baseline shows whether the well-behaved streams noticed.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ...errors import InvalidParameter
from ..fixtures import git_commit, machine
from ..loadgen.mix import load_mix
from ..loadgen.run import run_load
from . import degrade

IMAGE = {"frame_drops", "slide_blur", "slide_offset"}
MODALITY = {"audio_noise", "audio_dropout"} | IMAGE
FAULTS = {"model_delay", "model_fault", "clear_faults", "kill_server", "term_server", "redis_kill", "redis_slow",
          "redis_partition", "slow_reader", "half_open", "never_end"} | MODALITY
REDIS = {"redis_kill", "redis_slow", "redis_partition"}
CLIENTS = {"slow_reader", "half_open", "never_end"}


def load_experiment(path: Path) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidParameter(f"cannot read the experiment {path}: {exc}") from exc
    for f in doc.get("faults", []):
        if f.get("kind") not in FAULTS:
            raise InvalidParameter(f"unknown fault kind {f.get('kind')!r}; one of {sorted(FAULTS)}")
    load = doc.get("load") or {}
    if int(load.get("streams", 0)) < 1 or float(load.get("duration", 0)) <= 0:
        raise InvalidParameter("load needs streams >= 1 and duration > 0")
    if doc.get("store", "sqlite") not in ("sqlite", "redis"):
        raise InvalidParameter("store must be sqlite or redis")
    if any(f["kind"] in REDIS for f in doc.get("faults", [])) and doc.get("store") != "redis":
        raise InvalidParameter("redis_* faults need `store: redis` (the runner starts Redis behind its own proxy)")
    return doc


class ManagedStore:
    """The stream log the experiment's server uses: its SQLite file, or a redis-server of ours behind a TCP proxy."""

    def __init__(self, kind: str, state: Path) -> None:
        self.kind = kind
        self.state = state
        self.redis: Any = None
        self.proxy: Any = None

    def start(self) -> dict[str, str]:
        """Start what is needed; returns the server's environment for it."""
        if self.kind != "redis":
            return {}
        from .proxy import TcpProxy
        from .redis_server import ManagedRedis

        self.redis = ManagedRedis(self.state / "redis")
        self.redis.start()
        self.proxy = TcpProxy("127.0.0.1", self.redis.port)
        port = self.proxy.start()
        return {"LINGUAFUSION_STATE__REDIS_URL": f"redis://127.0.0.1:{port}/0"}

    def logged(self, stream_id: str) -> list[int]:
        """The seq numbers in a stream's log (read around the proxy, after the run)."""
        from ...state.redis_streams import RedisStreamStore
        from ...state.streams import SQLiteStreamStore

        store: Any = RedisStreamStore(self.redis.url) if self.kind == "redis" else SQLiteStreamStore(self.state)
        try:
            return [int(e["seq"]) for e in store.finals_after(stream_id, 0)]
        except Exception:  # noqa: BLE001 - a store we cannot read reports "nothing logged"
            return []
        finally:
            store.close()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.redis is not None:
            self.redis.stop()


class ManagedServer:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="lf-chaos-"))
        self.args = args
        self.env = env
        self.port = 0
        self.proc: Any = None

    def start(self) -> str:
        import os
        import subprocess
        import sys

        if not self.port:
            from .redis_server import free_port

            self.port = free_port()
        exe = str(Path(sys.executable).parent / "linguafusion")
        log = open(self.state / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen([exe, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--state-dir",
                                      str(self.state), "--chaos", "--log-level", "warning", *self.args],
                                     stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise InvalidParameter(f"the server exited: see {self.state / 'server.log'}")
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise InvalidParameter("the server did not become ready in 120 s")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()


def _image_fault(faults: list[dict[str, Any]], seed: int) -> Any:
    """Camera / slide faults for the whole run (the load must send slides: a mix with ``slides: true``)."""
    mods = [f for f in faults if f["kind"] in IMAGE]
    if not mods:
        return None

    def apply(png: bytes, frame: int) -> bytes | None:
        import io

        import numpy as np
        from PIL import Image

        image = None
        for f in mods:
            level = float(f.get("level", 0.1))
            if f["kind"] == "frame_drops":
                if not degrade.drop_mask(1, level, seed=seed * 1_000_003 + frame)[0]:
                    return None
                continue
            if image is None:
                image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
            image = degrade.apply("blur" if f["kind"] == "slide_blur" else "offset", level, image=image)
        if image is None:
            return png
        out = io.BytesIO()
        Image.fromarray(image).save(out, "PNG")
        return out.getvalue()

    return apply


def _audio_fault(faults: list[dict[str, Any]], seed: int) -> Any:
    mods = [f for f in faults if f["kind"] in MODALITY - IMAGE]
    if not mods:
        return None

    def apply(audio: Any) -> Any:
        for f in mods:
            study = "noise" if f["kind"] == "audio_noise" else "dropout"
            audio = degrade.apply(study, float(f.get("level", 10.0)), audio=audio, seed=seed)
        return audio

    return apply


async def _clients(url: str, f: dict[str, Any], pcm: bytes) -> list[dict[str, Any]]:
    """Misbehaving clients beside the load (chaos/clients.py); their outcomes."""
    from ...sdk.client import ws_url
    from ...sdk.stream import start_message
    from . import clients

    ws = ws_url(url.rstrip("/"))
    # the misbehaving clients ask for little (batch class, no partials) so admission lets them in beside the load
    start = start_message(["es"], "en", "batch", False, 0.5, None, False, 0.4)
    n, for_s = int(f.get("count", 1)), float(f.get("for_s", 30.0))
    if f["kind"] == "slow_reader":
        # texts_per_s > 0 adds large incompressible text captions (into the source language, no MT) so the
        # server's event queue fills within seconds; audio alone fills it only after minutes
        texts = float(f.get("texts_per_s", 0.0))
        words = " ".join(secrets.token_hex(4) for _ in range(4500))
        reader_start = start_message(["en"], "en", "batch", False, 0.5, None, False, 0.4) if texts else start
        runs = [clients.slow_reader(ws, None, reader_start, pcm, seconds=for_s,
                                    read_after_s=float(f.get("read_after_s", for_s)), texts_per_s=texts,
                                    text=words if texts else "This line was sent as text.")
                for _ in range(n)]
    elif f["kind"] == "half_open":  # it will send nothing: no speech capacity reserved for it
        silent = start_message(["es"], "en", "batch", False, 0.5, None, False, 0.4, inputs=["text"])
        runs = [clients.half_open(ws, None, silent, seconds=for_s) for _ in range(n)]
    else:
        runs = [clients.never_end(ws, None, start, pcm, send_s=float(f.get("send_s", 5.0)), seconds=for_s)
                for _ in range(n)]
    return list(await asyncio.gather(*runs))


async def _redis_fault(store: ManagedStore, f: dict[str, Any], entry: dict[str, Any]) -> None:
    if store.redis is None:
        raise InvalidParameter("redis_* faults need `store: redis`")
    if f["kind"] == "redis_kill":
        await asyncio.to_thread(store.redis.kill)
        await asyncio.sleep(float(f.get("down_s", 5.0)))
        t = time.monotonic()
        await asyncio.to_thread(store.redis.start)
        entry["restart_s"] = round(time.monotonic() - t, 2)
        return
    if f["kind"] == "redis_slow":
        store.proxy.set_mode("slow", delay_s=float(f.get("delay_s", 0.5)))
    else:
        store.proxy.set_mode("partition")
    await asyncio.sleep(float(f.get("for_s", 10.0)))
    store.proxy.set_mode("pass")
    entry["proxy"] = store.proxy.stats()


async def _schedule(server: ManagedServer, url: str, faults: list[dict[str, Any]], log: list[dict[str, Any]],
                    t0: float, store: ManagedStore | None = None, pcm: bytes = b"") -> None:
    """Fire the faults on time; faults that last (Redis outages, misbehaving clients) run beside the next ones."""
    lasting: list[asyncio.Task[None]] = []
    for f in sorted((f for f in faults if f["kind"] not in MODALITY), key=lambda f: float(f.get("at", 0))):
        delay = t0 + float(f.get("at", 0)) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        entry: dict[str, Any] = {**f, "fired_at": round(time.monotonic() - t0, 2)}
        if f["kind"] in REDIS | CLIENTS:
            lasting.append(asyncio.create_task(_lasting(f, entry, log, url, store, t0, pcm)))
            continue
        try:
            if f["kind"] in ("model_delay", "model_fault"):
                body = {"model": f.get("model", "*"), "kind": f.get("fault", "delay"),
                        "delay_s": f.get("delay_s", 60.0 if f.get("fault") == "hang" else 1.0),
                        "fraction": f.get("fraction", 1.0), "after": f.get("after", 0),
                        "jitter_s": f.get("jitter_s", 0.0)}
                async with httpx.AsyncClient(timeout=10) as http:
                    r = await http.post(url + "/v1/admin/faults", json=body)
                entry["status"] = r.status_code
            elif f["kind"] == "clear_faults":
                async with httpx.AsyncClient(timeout=10) as http:
                    entry["status"] = (await http.delete(url + "/v1/admin/faults")).status_code
            else:
                sig = signal.SIGKILL if f["kind"] == "kill_server" else signal.SIGTERM
                await asyncio.to_thread(server.signal, sig)
                t_down = time.monotonic()
                await asyncio.to_thread(server.start)
                entry["restart_s"] = round(time.monotonic() - t_down, 2)
        except (httpx.HTTPError, OSError) as exc:
            entry["error"] = str(exc)
        log.append(entry)
    await asyncio.gather(*lasting)


async def _lasting(f: dict[str, Any], entry: dict[str, Any], log: list[dict[str, Any]], url: str,
                   store: ManagedStore | None, t0: float, pcm: bytes) -> None:
    try:
        if f["kind"] in REDIS:
            await _redis_fault(store or ManagedStore("sqlite", Path(".")), f, entry)
        else:
            entry["clients"] = await _clients(url, f, pcm)
    except (InvalidParameter, OSError) as exc:
        entry["error"] = str(exc)
    entry["ended_at"] = round(time.monotonic() - t0, 2)
    log.append(entry)


def run_experiment(path: Path, console: Any) -> dict[str, Any]:
    doc = load_experiment(path)
    server_cfg = doc.get("server") or {}
    server = ManagedServer([str(a) for a in server_cfg.get("args", ["--no-auth"])],
                           {str(k): str(v) for k, v in (server_cfg.get("env") or {}).items()})
    load = doc["load"]
    mix = load_mix(Path(load["mix"]) if load.get("mix") else None)
    n, duration, seed = int(load["streams"]), float(load["duration"]), int(doc.get("seed", 0))
    faults = list(doc.get("faults", []))
    store = ManagedStore(str(doc.get("store", "sqlite")), server.state)
    report: dict[str, Any] = {"schema": "linguafusion.chaos/1", "name": doc.get("name", path.stem),
                              "commit": git_commit(), "machine": machine(), "experiment": doc}
    try:
        server.env.update(store.start())
        url = server.start()
        if doc.get("baseline", True):
            console.print("baseline run (no faults)", markup=False)
            report["baseline"] = asyncio.run(run_load(url, None, mix, n, duration, seed=seed))

        async def faulted() -> dict[str, Any]:
            log: list[dict[str, Any]] = []
            tasks: list[asyncio.Task[None]] = []
            pcm = b""
            if any(f["kind"] in CLIENTS for f in faults):  # synthesised before the load, not during it
                from ..loadgen.mix import material

                pcm = (await asyncio.to_thread(material, "synth")).pcm

            def start_schedule() -> None:  # time zero = the load's first stream
                tasks.append(asyncio.create_task(_schedule(server, url, faults, log, time.monotonic(), store,
                                                           pcm)))

            try:
                res = await run_load(url, None, mix, n, duration, seed=seed,
                                     audio_fault=_audio_fault(faults, seed), on_start=start_schedule,
                                     image_fault=_image_fault(faults, seed))
            finally:
                await asyncio.gather(*tasks, return_exceptions=True)
            res["faults"] = log
            return res

        console.print("run with faults", markup=False)
        report["faulted"] = asyncio.run(faulted())
        server.stop()
        # every caption a client received must be in the stream log once the run is over (the write-ahead promise)
        f = report["faulted"]
        f["integrity"]["missing_from_log"] = sum(
            len(set(s["seqs"]) - set(store.logged(s["stream_id"]))) for s in f.get("streams_seen", [])
            if s.get("stream_id"))
    finally:
        server.stop()
        store.stop()
    f = report["faulted"]
    report["summary"] = {
        "lost": f["integrity"]["lost"], "duplicated": f["integrity"]["duplicated"],
        "missing_from_log": f["integrity"]["missing_from_log"], "not_durable": f["integrity"]["not_durable"],
        "failed_finals": f["integrity"]["failed"],
        "reconnects": f["integrity"]["reconnects"], "goodput_faulted": f["goodput_streams"],
        "goodput_baseline": report.get("baseline", {}).get("goodput_streams"),
        "captions_faulted": f["client_captions"],
        "captions_baseline": report.get("baseline", {}).get("client_captions"),
    }
    return report
