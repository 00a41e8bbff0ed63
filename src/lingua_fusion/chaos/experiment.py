"""Chaos experiments as code: ``linguafusion chaos run experiment.yaml``.

The runner starts the server itself (so it can kill and restart it on the same port with the same state store),
optionally runs the load once without faults (the baseline), then runs it again while the experiment's faults fire
on their schedule, and writes one JSON (and HTML) report with both runs, the fault log and the integrity counts
(committed captions lost / duplicated). See examples/chaos/ and docs/reliability.md.

Faults (``kind``):
  model_delay   {model: asr|mt|ocr|tts|*, delay_s, fraction}   via the server's /v1/admin/faults (needs --chaos)
  clear_faults  {}
  kill_server   {}                      SIGKILL, then restart on the same port and state directory
  term_server   {}                      SIGTERM (graceful drain), then restart
  audio_noise   {level: SNR dB}         for the whole run: the streams' audio carries white noise
  audio_dropout {level: gaps per s}     for the whole run: 120-480 ms gaps
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ..errors import InvalidParameter
from ..eval.runner import git_commit, machine
from ..loadgen.mix import load_mix
from ..loadgen.run import run_load
from . import degrade

FAULTS = {"model_delay", "clear_faults", "kill_server", "term_server", "audio_noise", "audio_dropout"}
MODALITY = {"audio_noise", "audio_dropout"}


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
    return doc


class ManagedServer:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="lf-chaos-"))
        self.args = args
        self.env = env
        self.port = 0
        self.proc: Any = None

    def start(self) -> str:
        import os
        import socket
        import subprocess
        import sys

        if not self.port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = int(s.getsockname()[1])
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


def _audio_fault(faults: list[dict[str, Any]], seed: int) -> Any:
    mods = [f for f in faults if f["kind"] in MODALITY]
    if not mods:
        return None

    def apply(audio: Any) -> Any:
        for f in mods:
            study = "noise" if f["kind"] == "audio_noise" else "dropout"
            audio = degrade.apply(study, float(f.get("level", 10.0)), audio=audio, seed=seed)
        return audio

    return apply


async def _schedule(server: ManagedServer, url: str, faults: list[dict[str, Any]], log: list[dict[str, Any]],
                    t0: float) -> None:
    for f in sorted((f for f in faults if f["kind"] not in MODALITY), key=lambda f: float(f.get("at", 0))):
        delay = t0 + float(f.get("at", 0)) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        entry: dict[str, Any] = {**f, "fired_at": round(time.monotonic() - t0, 2)}
        try:
            if f["kind"] == "model_delay":
                async with httpx.AsyncClient(timeout=10) as http:
                    r = await http.post(url + "/v1/admin/faults", json={"model": f.get("model", "*"),
                                                                         "delay_s": f.get("delay_s", 1.0),
                                                                         "fraction": f.get("fraction", 1.0)})
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


def run_experiment(path: Path, console: Any) -> dict[str, Any]:
    doc = load_experiment(path)
    server_cfg = doc.get("server") or {}
    server = ManagedServer([str(a) for a in server_cfg.get("args", ["--no-auth"])],
                           {str(k): str(v) for k, v in (server_cfg.get("env") or {}).items()})
    load = doc["load"]
    mix = load_mix(Path(load["mix"]) if load.get("mix") else None)
    n, duration, seed = int(load["streams"]), float(load["duration"]), int(doc.get("seed", 0))
    faults = list(doc.get("faults", []))
    report: dict[str, Any] = {"schema": "linguafusion.chaos/1", "name": doc.get("name", path.stem),
                              "commit": git_commit(), "machine": machine(), "experiment": doc}
    try:
        url = server.start()
        if doc.get("baseline", True):
            console.print("baseline run (no faults)", markup=False)
            report["baseline"] = asyncio.run(run_load(url, None, mix, n, duration, seed=seed))

        async def faulted() -> dict[str, Any]:
            log: list[dict[str, Any]] = []
            tasks: list[asyncio.Task[None]] = []

            def start_schedule() -> None:  # time zero = the load's first stream
                tasks.append(asyncio.create_task(_schedule(server, url, faults, log, time.monotonic())))

            try:
                res = await run_load(url, None, mix, n, duration, seed=seed,
                                     audio_fault=_audio_fault(faults, seed), on_start=start_schedule)
            finally:
                await asyncio.gather(*tasks, return_exceptions=True)
            res["faults"] = log
            return res

        console.print("run with faults", markup=False)
        report["faulted"] = asyncio.run(faulted())
    finally:
        server.stop()
    f = report["faulted"]
    report["summary"] = {
        "lost": f["integrity"]["lost"], "duplicated": f["integrity"]["duplicated"],
        "reconnects": f["integrity"]["reconnects"], "goodput_faulted": f["goodput_streams"],
        "goodput_baseline": report.get("baseline", {}).get("goodput_streams"),
        "captions_faulted": f["client_captions"], "captions_baseline": report.get("baseline", {}).get("client_captions"),
    }
    return report
