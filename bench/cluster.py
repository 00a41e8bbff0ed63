"""Issue-15 figures: model work on Ray Serve model replicas (docs/cluster.md), on a two-node Ray cluster on
loopback (cluster/local.py: one CPU per node, so one model replica per node).

    .venv/bin/python bench/cluster.py --json bench/results/cluster.json [--captions 48] [--concurrency 12]

1. Throughput from 1 to 2 model replicas: captions (ASR of one spoken sentence, then MT en->es of its text, each a
   committed call through ``ClusterExecutor``, the gateways' ModelPort) with ``--concurrency`` in flight; captions/s
   and per-replica efficiency = rate(2) / (2 x rate(1)). Once with 1 ASR thread per replica, once with 2 (the
   default): this machine has 2 cores, so with 2 threads one replica already uses both.
2. The latency the Ray hop adds: the same single items one at a time, alternating an in-process ``Executor`` (this
   process, the same settings) and ``ClusterExecutor`` -> one idle replica, in the same run.
3. Kills (``--kills N``, needs Redis: run under scripts/with-redis.sh; writes bench/results/cluster_kills.json):
   ``linguafusion serve --cluster`` with 2 gateways and 1 model replica; N live streams (`linguafusion stream
   --realtime`, 6 sentences, 21 s) whose gateway is SIGKILLed 0.5-2.5 s after a caption, and N whose model replica
   is SIGKILLed while it runs a batch: captions lost, repeated or failed, kill -> next caption, and for the model
   replica kill -> its replacement's process.

    bash scripts/with-redis.sh .venv/bin/python bench/cluster.py --kills 3 --json bench/results/cluster_kills.json

4. Autoscaling (``--autoscale``; writes bench/results/cluster_autoscale.json): the model deployment with
   ``min 1, max 2`` replicas under ``autoscale.slo_policy``, 400 captions with 40 in flight; the replica states
   every 3 s (Serve's status) and when the second replica was asked for and running.

    .venv/bin/python bench/cluster.py --autoscale --json bench/results/cluster_autoscale.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

SENTENCES = ["Good morning everyone and welcome to the quarterly review.", "The new office will open in the spring.",
             "Please send me the report before Friday.", "We need more time to finish the project.",
             "Our team has grown by twelve people this year.", "Thank you all for your hard work."]


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1)


def utterances() -> list[np.ndarray]:
    from conftest import piper_wav

    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media import decode_audio

    return [decode_audio(piper_wav(s), LimitSettings())[0] for s in SENTENCES]


async def caption(port: Any, audio: np.ndarray, n: int) -> None:
    from lingua_fusion.serving.keys import ModelKey
    from lingua_fusion.serving.ports import AsrInput, CallContext, MtInput

    ctx = CallContext(f"st_bench_{n}", slo="standard", key_id="bench")
    out = await port.run(ModelKey.asr("en"), AsrInput(audio), ctx)
    await port.run(ModelKey.mt("en", "es"), MtInput(out.text), ctx)


async def throughput(port: Any, audio: list[np.ndarray], captions: int, concurrency: int) -> float:
    """Captions per second with ``concurrency`` in flight (after one warm round, not timed)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(n: int) -> None:
        async with gate:
            await caption(port, audio[n % len(audio)], n)

    await asyncio.gather(*(one(n) for n in range(concurrency)))
    t0 = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(captions)))
    return captions / (time.perf_counter() - t0)


async def hop(local: Any, remote: Any, audio: list[np.ndarray], rounds: int) -> dict[str, Any]:
    from lingua_fusion.serving.keys import ModelKey
    from lingua_fusion.serving.ports import AsrInput, CallContext, MtInput

    items = {"asr": (ModelKey.asr("en"), [AsrInput(a) for a in audio]),
             "mt": (ModelKey.mt("en", "es"), [MtInput(s) for s in SENTENCES])}
    out: dict[str, Any] = {}
    for stage, (key, payloads) in items.items():
        times: dict[str, list[float]] = {"in_process": [], "ray": []}
        for r in range(rounds + 2):
            for name, port in (("in_process", local), ("ray", remote)) if r % 2 == 0 else \
                    (("ray", remote), ("in_process", local)):
                t0 = time.perf_counter()
                await port.run(key, payloads[r % len(payloads)], CallContext("st_hop", key_id="bench"))
                if r >= 2:  # two warm rounds
                    times[name].append((time.perf_counter() - t0) * 1000)
        out[stage] = {name: {"p50_ms": pct(v, 50), "p99_ms": pct(v, 99), "n": len(v)} for name, v in times.items()}
        out[stage]["added_p50_ms"] = round(out[stage]["ray"]["p50_ms"] - out[stage]["in_process"]["p50_ms"], 1)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from lingua_fusion.cluster.deploy import NAMESPACE, ClusterSpec, model_app
    from lingua_fusion.cluster.gateway import MODEL_DEPLOYMENT, MODELS_APP
    from lingua_fusion.cluster.port import ClusterExecutor
    from lingua_fusion.config import Settings
    from lingua_fusion.models.registry import Registry
    from lingua_fusion.serving.executor import Executor

    audio = utterances()
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    runs: list[dict[str, Any]] = []
    hop_result: dict[str, Any] = {}
    for threads in args.threads:
        settings = Settings()
        settings.models.asr_threads = threads
        for rep in range(args.repeats):  # 1 then 2 replicas, repeated: the machine's other load drifts
            for replicas in (1, 2):
                serve.run(model_app(settings, ClusterSpec(model_replicas=replicas)), name=MODELS_APP,
                          route_prefix=None)
                handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=MODELS_APP)
                port = ClusterExecutor(Registry(settings), settings, handle=handle)
                if replicas == 1 and rep == 0 and threads == args.threads[-1]:
                    local = Executor(Registry(settings), settings)
                    hop_result = await hop(local, port, audio, args.rounds)
                    await local.close()
                rate = await throughput(port, audio, args.captions, args.concurrency)
                runs.append({"asr_threads": threads, "replicas": replicas, "repeat": rep,
                             "captions_per_s": round(rate, 2)})
                print(json.dumps(runs[-1]), flush=True)
                await port.close()
                serve.delete(MODELS_APP)
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        def median(replicas: int, threads: int = threads) -> float:
            return float(np.median([r["captions_per_s"] for r in runs
                                    if r["asr_threads"] == threads and r["replicas"] == replicas]))

        one = median(1)
        for replicas in (1, 2):
            rate = median(replicas)
            rows.append({"asr_threads": threads, "replicas": replicas, "captions": args.captions,
                         "concurrency": args.concurrency, "repeats": args.repeats, "captions_per_s": round(rate, 2),
                         "speedup": round(rate / one, 2), "per_replica_efficiency": round(rate / (replicas * one), 2)})
    serve.shutdown()
    ray.shutdown()
    return {"throughput": rows, "runs": runs, "hop": hop_result}


REPLICA = "ServeReplica:lf-models:ModelReplica"
KILL_URL = "http://127.0.0.1:18719"
KILL_CLUSTER = "127.0.0.1:18719"  # its name in Redis keys (heartbeat.cluster_name)


def until(cond: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError


def kill_runs(args: argparse.Namespace, address: str) -> dict[str, Any]:
    """``linguafusion serve --cluster`` on ``address``; then one stream per kill, gateway and model replica in turn."""
    import random
    import signal
    import subprocess
    import tempfile

    import httpx
    from conftest import BIN, talk_wav

    from lingua_fusion.cluster.local import live_gateways

    redis_url = os.environ["LINGUAFUSION_TEST_REDIS_URL"]
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="lf-cluster-kills-"))
    talk = tmp / "talk.wav"
    talk.write_bytes(talk_wav(SENTENCES))
    env = {**os.environ, "LINGUAFUSION_STATE__REDIS_URL": redis_url, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen([str(BIN), "serve", "--cluster", "--ray-address", address, "--port", "18719",
                               "--no-auth", "--state-dir", str(tmp), "--gateways", "2", "--model-replicas",
                               str(args.kill_model_replicas)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def ready() -> bool:
        try:
            up = httpx.get(KILL_URL + "/readyz", timeout=2).status_code == 200
            return up and len(live_gateways(redis_url, KILL_CLUSTER)) == 2
        except httpx.TransportError:
            return False

    runs: list[dict[str, Any]] = []
    try:
        until(ready, 180)
        for n in range(args.kills * 2):
            runs.append(one_kill("gateway" if n % 2 == 0 else "model replica", talk, redis_url, rng.uniform(0.5, 2.5)))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()
    return {"kills": runs, "model_replicas": args.kill_model_replicas}


def one_kill(target: str, talk: Path, redis_url: str, pause_s: float) -> dict[str, Any]:
    """One live stream; its gateway (``pause_s`` after its first caption) or the model replica (mid-batch) killed."""
    import signal
    import subprocess
    import threading

    from conftest import BIN

    from lingua_fusion.cluster.local import kill_when_busy, live_gateways, replica_pids

    cli = subprocess.Popen([str(BIN), "stream", str(talk), "--to", "es", "--realtime", "--json", "--url", KILL_URL,
                            "--no-partials"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: list[tuple[float, dict[str, Any]]] = []
    first = threading.Event()

    def read() -> None:
        assert cli.stdout is not None
        for line in cli.stdout:
            got.append((time.monotonic(), json.loads(line)))
            if got[-1][1].get("type") == "final":
                first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    first.wait(90)
    replaced_s = None
    if target == "gateway":
        time.sleep(pause_s)
        victim = until(lambda: next((b for b in live_gateways(redis_url, KILL_CLUSTER) if b.streams), None), 20).pid
        t_kill = time.monotonic()
        os.kill(victim, signal.SIGKILL)
    else:
        before = replica_pids(REPLICA)
        kill_when_busy(before[0])
        t_kill = time.monotonic()
        until(lambda: [p for p in replica_pids(REPLICA) if p not in before], 120)
        replaced_s = round(time.monotonic() - t_kill, 2)
    cli.wait(timeout=180)
    reader.join(timeout=10)
    err = cli.stderr.read() if cli.stderr else ""
    finals = [(t, e) for t, e in got if e.get("type") == "final"]
    seqs = [e["seq"] for _, e in finals]
    after = [t for t, _ in finals if t > t_kill]
    return {"target": target, "captions": len(finals), "gap_free": seqs == list(range(1, len(seqs) + 1)),
            "lost": len(set(range(1, max(seqs, default=0) + 1)) - set(seqs)), "repeated": len(seqs) - len(set(seqs)),
            "failed": sum(1 for _, e in finals if e.get("failed")), "reconnected": "reconnected" in err,
            "kill_to_next_caption_s": round(after[0] - t_kill, 2) if after else None,
            "replacement_process_s": replaced_s, "exit": cli.returncode}


async def autoscale_run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from lingua_fusion.cluster.deploy import NAMESPACE, ClusterSpec, model_app
    from lingua_fusion.cluster.gateway import MODEL_DEPLOYMENT, MODELS_APP
    from lingua_fusion.cluster.port import ClusterExecutor
    from lingua_fusion.config import Settings
    from lingua_fusion.models.registry import Registry

    audio = utterances()
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    settings = Settings()
    serve.run(model_app(settings, ClusterSpec(model_replicas=1, max_model_replicas=2)), name=MODELS_APP,
              route_prefix=None)
    port = ClusterExecutor(Registry(settings), settings,
                           handle=serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=MODELS_APP))
    t0 = time.perf_counter()
    timeline: list[dict[str, Any]] = []

    async def watch() -> None:
        while True:
            st = serve.status().applications[MODELS_APP].deployments[MODEL_DEPLOYMENT]
            timeline.append({"t_s": round(time.perf_counter() - t0, 1), **{str(k): v for k, v in
                                                                          st.replica_states.items()}})
            await asyncio.sleep(3)

    watcher = asyncio.create_task(watch())
    gate = asyncio.Semaphore(args.autoscale_in_flight)

    async def one(n: int) -> None:
        async with gate:
            await caption(port, audio[n % len(audio)], n)

    await asyncio.gather(*(one(n) for n in range(args.autoscale_captions)))
    load_s = round(time.perf_counter() - t0, 1)
    await asyncio.sleep(6)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    await port.close()
    serve.shutdown()
    ray.shutdown()
    asked = next((p["t_s"] for p in timeline if sum(v for k, v in p.items() if k != "t_s") > 1), None)
    running = next((p["t_s"] for p in timeline if p.get("RUNNING", 0) > 1), None)
    return {"autoscale": {"min_replicas": 1, "max_replicas": 2, "in_flight": args.autoscale_in_flight,
                          "captions": args.autoscale_captions, "load_s": load_s, "second_replica_asked_s": asked,
                          "second_replica_running_s": running, "timeline": timeline}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/cluster.json")
    ap.add_argument("--captions", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2, help="1-then-2-replica measurements per thread setting")
    ap.add_argument("--rounds", type=int, default=20, help="timed single items per stage and path (hop latency)")
    ap.add_argument("--kills", type=int, default=0, help="the kill experiment instead: N kills of each kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-model-replicas", type=int, default=1, help="model replicas in the kill experiment")
    ap.add_argument("--autoscale", action="store_true", help="the autoscaling run instead")
    ap.add_argument("--autoscale-in-flight", type=int, default=40)
    ap.add_argument("--autoscale-captions", type=int, default=400)
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    args = ap.parse_args()

    from lingua_fusion.cluster.local import LocalRay
    from lingua_fusion.lab.fixtures import git_commit, machine

    load_before = os.getloadavg()[0]  # the machine is shared: its other load is part of the figures
    cluster = LocalRay(nodes=2, cpus_per_node=1)
    cluster.stop()
    cluster.start()
    args.address = cluster.address
    try:
        if args.kills:
            result = kill_runs(args, cluster.address)
        else:
            result = asyncio.run(autoscale_run(args) if args.autoscale else main_async(args))
    finally:
        cluster.stop()
    report = {"commit": git_commit(), "machine": machine(), "load_avg_1m": [load_before, os.getloadavg()[0]],
              "nodes": 2, "cpus_per_node": 1, **result}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k in ("throughput", "hop", "kills", "autoscale")}, indent=1))


if __name__ == "__main__":
    main()
