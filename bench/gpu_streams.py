"""GPU engine figures (issue 12), for one GPU: streams per GPU through the real stream engine, memory of the paged
caches against naive preallocation, and decoder / encoder throughput against Hugging Face's own decoding.

    python bench/gpu_streams.py --json bench/results/gpu_streams.json            # on the GPU machine
    python bench/gpu_streams.py --device cpu --quick --streams 4 --multi-streams 4 --json /tmp/gpu_cpu.json  # tiny, CPU

Models are the real architectures (Hugging Face WhisperForConditionalGeneration at base size, MarianMTModel at
OPUS-MT size) with random weights: the shipped weights cannot travel to the GPU machine (over 64 MiB) and the
costs are the same. Random weights never emit end-of-text, so every decode is capped at a real output length
(speech: 3 tokens per second of audio + 4; translation: the source length + 4), which the JSON states.

Streams (figure 1): N in-process clients, each playing synthetic speech (noise bursts of 1.5-3.5 s between
0.5-0.8 s pauses) at real time in ``--chunk-ms`` chunks into its own StreamSession (timeline, VAD lane, commit
policy, scheduler, executor, journal on SQLite, one process); caption latency = the end of an utterance received
-> its translated final emitted (the session's own measure). The baseline runs the same engine with every stream
served by its own unbatched calls (batch 1, Whisper's padded 30 s window), as open-source Whisper servers do.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lingua_fusion.config import Settings  # noqa: E402
from lingua_fusion.serving.executor import Executor  # noqa: E402
from lingua_fusion.serving.gpu.encoder_graphs import EncoderGraphs  # noqa: E402
from lingua_fusion.serving.gpu.graphs import buckets_up_to  # noqa: E402
from lingua_fusion.serving.gpu.models import HFWhisperDecoder, MarianDecoder  # noqa: E402
from lingua_fusion.serving.gpu.paged import PagedKV  # noqa: E402
from lingua_fusion.serving.gpu.recipes import (  # noqa: E402
    MEL_FRAMES_PER_S,
    Seq2SeqTextRecipe,
    WhisperRecipe,
    hf_whisper_encoder,
    marian_encoder,
)
from lingua_fusion.serving.gpu.runner import GpuRunner  # noqa: E402
from lingua_fusion.serving.gpu.vad import energy_vad  # noqa: E402
from lingua_fusion.stream.supervisor import BreakerSupervisor  # noqa: E402

SR = 16000
IDS = {"pad_token_id": 50256, "bos_token_id": 50257, "eos_token_id": 50256, "decoder_start_token_id": 50257}
SOT = [50258, 50259, 50359, 50363]  # start, language, transcribe, no timestamps
ENCODER_BATCHES = buckets_up_to(128, smallest=1)  # up to GpuRunner's encode_batch
MT_MAX_TOKENS = 96
ASR_SIZES = {"tiny": (384, 4, 6), "base": (512, 6, 8), "small": (768, 12, 12)}


def whisper(size: str, device: str, dtype: torch.dtype) -> Any:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    d, layers, heads = ASR_SIZES[size]
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=d, encoder_layers=layers, decoder_layers=layers,
                        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d,
                        decoder_ffn_dim=4 * d, max_source_positions=1500, max_target_positions=448, **IDS)
    return WhisperForConditionalGeneration(cfg).to(device=device, dtype=dtype).eval()


def marian(device: str, dtype: torch.dtype, small: bool) -> Any:
    from transformers import MarianConfig, MarianMTModel

    d, layers, heads, vocab = (64, 2, 4, 1000) if small else (512, 6, 8, 58101)
    cfg = MarianConfig(vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
                       encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d,
                       decoder_ffn_dim=4 * d, max_position_embeddings=512, pad_token_id=vocab - 1,
                       eos_token_id=0, decoder_start_token_id=vocab - 1)
    return MarianMTModel(cfg).to(device=device, dtype=dtype).eval()


def words(tokens: list[int]) -> str:
    return " ".join(f"w{t}" for t in tokens)


def build_runners(args: argparse.Namespace, asr_model: Any, mt_model: Any, *, baseline: bool) -> tuple[Any, Any]:
    from lingua_fusion.models.whisper_torch import LogMel

    dev, dtype = args.device, args.dtype
    logmel = LogMel(80).to(dev)
    vocab = mt_model.config.vocab_size
    graphs = args.graphs and args.kernel != "torch" and dev.startswith("cuda")  # the step's need Triton attention
    graphed = encoder_graph_parts(args) if dev.startswith("cuda") and not baseline else set()
    # one launch per encoder batch (serving/gpu/encoder_graphs.py), captured by the runner's thread that replays it
    asr_graphs = asr_encoder_graphs(hf_whisper_encoder(asr_model), dev, dtype) if "asr" in graphed else None
    mt_graphs = mt_encoder_graphs(mt_model, dev) if "mt" in graphed else None
    encode = asr_graphs or hf_whisper_encoder(asr_model)
    asr_recipe = WhisperRecipe(HFWhisperDecoder(asr_model), encode=encode,
                               mel=lambda a: logmel(a[None])[0], prompt=lambda _p: SOT, text=words,
                               mels=logmel.ragged if dev.startswith("cuda") else None,  # bench/mel_batch.py: why
                               stop=frozenset({50257}), device=dev, dtype=dtype, tokens_per_s=3.0, max_tokens=96,
                               pad_to_s=30.0 if baseline else None)
    mt_recipe = Seq2SeqTextRecipe(mt_model, MarianDecoder(mt_model),
                                  tokenize=lambda s: [hash(w) % (vocab - 2) + 1 for w in s.split()],
                                  detokenize=words, start=vocab - 1, stop=frozenset({0}), pad=vocab - 1, device=dev,
                                  length_ratio=1.0, max_tokens=MT_MAX_TOKENS,
                                  padded_encode=mt_graphs)
    asr_sizes = pools(asr_recipe.decoder, args.asr_self_gb, args.asr_cross_gb, dtype)
    mt_sizes = pools(mt_recipe.decoder, args.mt_gb / 2, args.mt_gb / 2, dtype)
    if baseline:  # one stream's work at a time: no batch in the encoder or the decoder
        return (GpuRunner(asr_recipe, max_batch=1, encode_batch=1, memo=0, name="asr-base", dtype=dtype, device=dev,
                          kernel=args.kernel, **asr_sizes),
                GpuRunner(mt_recipe, max_batch=1, encode_batch=1, name="mt-base", dtype=dtype, device=dev,
                          kernel=args.kernel, **mt_sizes))
    return (GpuRunner(asr_recipe, max_batch=args.max_batch, name="asr", dtype=dtype, device=dev, kernel=args.kernel,
                      graphs=graphs, prepare=[asr_graphs.capture_ahead] if asr_graphs else [], **asr_sizes),
            GpuRunner(mt_recipe, max_batch=args.max_batch, name="mt", dtype=dtype, device=dev, kernel=args.kernel,
                      graphs=graphs, prepare=[mt_graphs.capture_ahead] if mt_graphs else [], **mt_sizes))


def encoder_graph_parts(args: argparse.Namespace) -> set[str]:
    """Which encoders replay from CUDA graphs (``--encoder-graphs``): none without the step's graphs either."""
    return set(filter(None, args.encoder_graphs.split(","))) if args.graphs else set()


def asr_encoder_graphs(encode: Any, dev: str, dtype: torch.dtype) -> EncoderGraphs:
    """``encode`` replayed from CUDA graphs, every shape the recipe makes (1 s widths up to 30 s, batch buckets up to
    the runner's encoder batch of 128) captured by ``capture_ahead`` before serving."""
    return EncoderGraphs(encode, ENCODER_BATCHES, dev,
                         ahead=[[((80, s * MEL_FRAMES_PER_S), dtype)] for s in range(1, 31)])


def mt_encoder_graphs(model: Any, dev: str) -> EncoderGraphs:
    """Marian's encoder (``marian_encoder``: the mask always passed) replayed from CUDA graphs, every width the
    recipe makes (multiples of 8 tokens up to 96) and batch bucket captured by ``capture_ahead`` before serving."""
    return EncoderGraphs(marian_encoder(model), ENCODER_BATCHES, dev,
                         ahead=[[((w,), torch.long), ((w,), torch.long)] for w in range(8, MT_MAX_TOKENS + 1, 8)])


def pools(decoder: Any, self_gb: float, cross_gb: float, dtype: torch.dtype) -> dict[str, int]:
    """Block counts for pools of the given sizes (16-token self blocks, 64-frame cross blocks)."""
    per_token = PagedKV.bytes_per_token(decoder.n_layer, decoder.n_head, decoder.head_dim, dtype)
    return {"blocks": max(64, int(self_gb * 1e9 / (16 * per_token))),
            "cross_blocks": max(64, int(cross_gb * 1e9 / (64 * per_token)))}


def speech_like(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * SR), dtype=np.float32)
    t = 0.0
    while t < seconds:
        talk, pause = rng.uniform(1.5, 3.5), rng.uniform(0.5, 0.8)
        a, b = int(t * SR), int(min(seconds, t + talk) * SR)
        out[a:b] = rng.normal(0, 0.15, b - a).astype(np.float32)
        t += talk + pause
    return out


def watch_loop_lag(lags: list[float], every_s: float = 0.1) -> asyncio.Task[None]:
    """A task (cancel it when done) appending the running event loop's lag to ``lags``: how late a sleep of
    ``every_s`` wakes."""
    loop = asyncio.get_running_loop()

    async def watch() -> None:
        while True:
            t = loop.time()
            await asyncio.sleep(every_s)
            lags.append(loop.time() - t - every_s)

    return asyncio.create_task(watch(), name="loop-lag")


async def drive_streams(port: Any, breakers: Any, first: int, n: int, seconds: float, chunk_ms: int, slo: str,
                        audio: np.ndarray, state_dir: Path) -> dict[str, Any]:
    """Streams ``first .. first + n - 1`` of a run, paced at real time through sessions on ``port`` (the in-process
    Executor, or a worker's RemotePort to the model process), built with ``breakers`` (a BreakerSupervisor, the
    service's SLO breakers) as its observer. Returns the raw figures of this process."""
    from lingua_fusion.state.streams import SQLiteStreamStore
    from lingua_fusion.stream.journal import StreamLog
    from lingua_fusion.stream.protocol import StreamSpec
    from lingua_fusion.stream.service import StreamService
    from lingua_fusion.stream.session import StreamSession

    settings = port.settings
    log = StreamLog(SQLiteStreamStore(state_dir))
    service = StreamService(port, settings, supervisor=breakers, log=log)
    chunk = int(SR * chunk_ms / 1000)
    pcm = (audio * 32767).astype("<i2")
    latencies: list[float] = []
    lags: list[float] = []
    loop = asyncio.get_running_loop()
    t_start = loop.time() + 1.0

    async def one(i: int) -> None:
        spec = StreamSpec(source_lang="en", targets=["es"], slo=slo, partials=True, min_confidence=0.0)
        s = StreamSession(spec, port, service, settings, log=log)
        await s.open()
        offset = (i * 7919 * chunk) % (len(pcm) - int(seconds * SR)) // chunk * chunk
        t0 = t_start + (i % 100) * chunk_ms / 100_000  # starts spread over one chunk

        async def drain() -> None:
            while True:
                ev = (await s.events.get()).to_wire()
                if ev["type"] == "final" and not ev.get("failed"):
                    latencies.append(ev["latency_ms"]["caption"] / 1000)
                if ev["type"] == "closed":
                    return

        reader = asyncio.create_task(drain())
        for k in range(int(seconds * 1000 / chunk_ms)):
            await asyncio.sleep(max(0.0, t0 + k * chunk_ms / 1000 - loop.time()))
            a = offset + k * chunk
            await s.feed_audio(pcm[a:a + chunk].tobytes(), k * chunk_ms / 1000)
        await s.end()
        await asyncio.wait_for(reader, timeout=120)

    watcher = watch_loop_lag(lags)
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        await asyncio.gather(*(one(i) for i in range(first, first + n)))
    finally:
        watcher.cancel()
        await service.close()  # its breaker ticker would keep the executor (and the GPU pools) alive
        await log.close()
    return {"latencies": latencies, "lags": lags, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.monotonic() - wall0}


def summarise(n: int, parts: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    latencies = [x for p in parts for x in p["latencies"]]
    lags = [x for p in parts for x in p["lags"]]
    lat = np.array(latencies) if latencies else np.array([float("nan")])
    return {"streams": n, "finals": len(latencies), "caption_p50_s": round(float(np.percentile(lat, 50)), 3),
            "caption_p99_s": round(float(np.percentile(lat, 99)), 3), "wall_s": round(wall, 1),
            "loop_lag_p99_ms": round(float(np.percentile(lags, 99)) * 1000, 1) if lags else None}


async def run_streams(executor: Executor, breakers: Any, n: int, seconds: float, chunk_ms: int, slo: str,
                      audio: np.ndarray, state_dir: Path) -> dict[str, Any]:
    """All streams in this process, beside the GPU engine (the one-process server): ``breakers`` is its observer."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    gpu = _gpu_sampler()
    stacks = _stack_sampler() if SAMPLE_STACKS is not None else None
    try:
        part = await drive_streams(executor, breakers, 0, n, seconds, chunk_ms, slo, audio, state_dir)
    finally:
        if stacks is not None and SAMPLE_STACKS is not None:
            await asyncio.to_thread(SAMPLE_STACKS.write_text, stacks())
    wall = time.monotonic() - wall0
    row = summarise(n, [part], wall)
    row["cpu_cores_busy"] = round((time.process_time() - cpu0) / wall, 2)
    row["gpu_busy_pct"] = gpu()
    return row


def _worker_main(path: str, first: int, n: int, seconds: float, chunk_ms: int, slo: str, audio: np.ndarray,
                 out: Any, go: Any) -> None:
    """A stream worker process (``serve --workers``): its share of the streams, model work over the socket.
    It connects, says so, and starts its streams when every worker has (``go``)."""
    from lingua_fusion.serving.shard.remote import ModelLink, RemotePort

    async def run() -> dict[str, Any]:
        settings = bench_settings()
        link = ModelLink(path, max_in_flight=1 << 15, connect_wait_s=30.0)
        link.start()
        await link.wait_up(30.0)
        breakers = BreakerSupervisor(settings)  # this worker's SLO breakers, as serve --workers builds them
        port = RemotePort(link, None, settings, observer=breakers)  # type: ignore[arg-type]
        out.put({"ready": first})
        await asyncio.to_thread(go.wait, 300)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                return await drive_streams(port, breakers, first, n, seconds, chunk_ms, slo, audio, Path(tmp))
        finally:
            await link.close()

    try:
        out.put(asyncio.run(run()))
    except BaseException as exc:  # the parent must hear of it, not wait for its timeout
        out.put({"error": repr(exc)})
        raise


async def run_sharded(executor: Executor, n: int, workers: int, seconds: float, chunk_ms: int, slo: str,
                      audio: np.ndarray) -> dict[str, Any]:
    """Streams sharded over ``workers`` processes; this process is the model process (the GPU engine)."""
    import multiprocessing as mp

    from lingua_fusion.serving.shard import codec
    from lingua_fusion.serving.shard.model_process import ModelServer

    server = ModelServer(executor.settings, None)  # type: ignore[arg-type]
    server.engines["batched"] = executor
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "model.sock")
        listener = await asyncio.start_unix_server(server.handle, path=path, limit=codec.MAX_FRAME)
        ctx = mp.get_context("spawn")
        out, go = ctx.Queue(), ctx.Event()
        shares = [n // workers + (1 if w < n % workers else 0) for w in range(workers)]
        firsts = [sum(shares[:w]) for w in range(workers)]
        procs = [ctx.Process(target=_worker_main, daemon=True,
                             args=(path, firsts[w], shares[w], seconds, chunk_ms, slo, audio, out, go))
                 for w in range(workers)]
        for p in procs:  # off the loop: a spawn start blocks until the child has imported this module
            await asyncio.to_thread(p.start)
        for _ in procs:
            hello = await asyncio.to_thread(out.get, True, 300)
            if "error" in hello:
                raise RuntimeError(f"a stream worker failed: {hello['error']}")
        cpu0, wall0 = time.process_time(), time.monotonic()
        gpu = _gpu_sampler()
        stacks = _stack_sampler() if SAMPLE_STACKS is not None else None
        lags: list[float] = []
        watcher = watch_loop_lag(lags)  # the model process's own loop
        go.set()
        parts = []
        try:
            for _ in procs:
                part = await asyncio.to_thread(out.get, True, seconds + 300)
                if "error" in part:
                    raise RuntimeError(f"a stream worker failed: {part['error']}")
                parts.append(part)
        finally:
            watcher.cancel()
            if stacks is not None and SAMPLE_STACKS is not None:
                await asyncio.to_thread(SAMPLE_STACKS.with_suffix(f".sharded{n}.txt").write_text, stacks())
            for p in procs:
                await asyncio.to_thread(p.join, 30)
                if p.is_alive():
                    p.kill()
            listener.close()
    wall = time.monotonic() - wall0
    row = summarise(n, parts, wall)
    row["workers"] = workers
    row["model_process_cores_busy"] = round((time.process_time() - cpu0) / wall, 2)
    row["worker_cores_busy"] = [round(p["cpu_s"] / p["wall_s"], 2) for p in parts]
    row["model_loop_lag_p99_ms"] = round(float(np.percentile(lags, 99)) * 1000, 1) if lags else None
    row["gpu_busy_pct"] = gpu()
    return row


def _model_proc_main(path: str, opts: dict[str, Any], share: int, out: Any, stop: Any, trace: Any = None) -> None:
    """One model process of the ``multi`` part (``serve --workers N --model-processes M``): its own models (random
    weights), GPU runners with 1/M of the pools, executor and ModelServer on ``path``, until ``stop`` is set. With
    ``trace`` (an event), a torch.profiler window is written under ``--trace-dir`` once it is set."""
    from lingua_fusion.serving.shard import codec
    from lingua_fusion.serving.shard.model_process import ModelServer

    args = argparse.Namespace(**opts)
    if args.switch_interval is not None:  # this process's threads: the event loop and the GPU runners
        sys.setswitchinterval(args.switch_interval)
    for name in ("asr_self_gb", "asr_cross_gb", "mt_gb"):
        setattr(args, name, getattr(args, name) / share)
    asr_model = whisper(args.asr, args.device, args.dtype)
    mt_model = marian(args.device, args.dtype, small=args.quick)
    asr, mt = build_runners(args, asr_model, mt_model, baseline=False)
    if trace is not None:
        from gpu_trace import capture_when

        capture_when(trace, args.trace_dir / f"streams{args.trace_at}", args.trace_seconds, {"asr": asr, "mt": mt})

    async def run() -> dict[str, Any]:
        settings = bench_settings()
        executor = Executor(None, settings, max_batch=args.max_batch, max_queue=1 << 16,  # type: ignore[arg-type]
                            backends={"asr": lambda _k: asr, "mt": lambda _k: mt,
                                      "vad": lambda _k: energy_vad(args.device)})
        server = ModelServer(settings, None)  # type: ignore[arg-type]
        server.engines["batched"] = executor
        listener = await asyncio.start_unix_server(server.handle, path=path, limit=codec.MAX_FRAME)
        lags: list[float] = []
        watcher = watch_loop_lag(lags)
        out.put({"ready": os.getpid()})
        await asyncio.to_thread(stop.wait, 3600)
        watcher.cancel()
        listener.close()
        await executor.close()
        return {"lag_p99_ms": round(float(np.percentile(lags, 99)) * 1000, 1) if lags else None}

    try:
        asyncio.run(run())
    finally:
        asr.close()
        mt.close()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_multi(args: argparse.Namespace, counts: list[int], workers: int, model_procs: int,
                    audio: np.ndarray, on_row: Any) -> None:
    """Streams over ``workers`` worker processes feeding ``model_procs`` model processes (worker w -> w % M), all
    on one GPU: ``serve --workers N --model-processes M``. The model processes live through the whole sweep (a
    server that keeps running); the workers and their streams are fresh for each count."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    opts = {k: v for k, v in vars(args).items() if k != "json"}
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(Path(tmp) / f"model-{j}.sock") for j in range(model_procs)]
        mq, stop, trace = ctx.Queue(), ctx.Event(), ctx.Event()
        models = [ctx.Process(target=_model_proc_main, daemon=True,
                              args=(paths[j], opts, model_procs, mq, stop, trace if args.trace_at and j == 0 else None))
                  for j in range(model_procs)]
        for p in models:
            await asyncio.to_thread(p.start)
        try:
            for _ in models:
                hello = await asyncio.to_thread(mq.get, True, 600)
                if "ready" not in hello:
                    raise RuntimeError(f"a model process failed: {hello}")
            if args.warmup:  # first shapes, Triton compiles and graph captures of these processes, unrecorded
                await _multi_once(argparse.Namespace(**{**vars(args), "seconds": 6.0}), args.warmup, workers, paths,
                                  [p.pid for p in models], ctx, audio)  # type: ignore[misc]
            for n in counts:
                row = await _multi_once(args, n, workers, paths, [p.pid for p in models], ctx, audio,  # type: ignore[misc]
                                        trace if n == args.trace_at else None)
                on_row(row)
                if not row["meets_3s"] or row["finals"] == 0:
                    break
        finally:
            stop.set()
            for p in models:
                await asyncio.to_thread(p.join, 60)
                if p.is_alive():
                    p.kill()


async def _multi_once(args: argparse.Namespace, n: int, workers: int, paths: list[str], pids: list[int],
                      ctx: Any, audio: np.ndarray, trace: Any = None) -> dict[str, Any]:
    out, go = ctx.Queue(), ctx.Event()
    shares = [n // workers + (1 if w < n % workers else 0) for w in range(workers)]
    firsts = [sum(shares[:w]) for w in range(workers)]
    procs = [ctx.Process(target=_worker_main, daemon=True,
                         args=(paths[w % len(paths)], firsts[w], shares[w], args.seconds, args.chunk_ms, args.slo,
                               audio, out, go))
             for w in range(workers)]
    for p in procs:
        await asyncio.to_thread(p.start)
    parts = []
    try:
        for _ in procs:
            hello = await asyncio.to_thread(out.get, True, 300)
            if "error" in hello:
                raise RuntimeError(f"a stream worker failed: {hello['error']}")
        cpu0 = [_cpu_s(pid) for pid in pids]
        wall0 = time.monotonic()
        gpu = _gpu_sampler()
        go.set()
        if trace is not None:  # model process 0 profiles a window in the middle of the run
            asyncio.get_running_loop().call_later(args.seconds * 0.4, trace.set)
        for _ in procs:
            part = await asyncio.to_thread(out.get, True, args.seconds + 300)
            if "error" in part:
                raise RuntimeError(f"a stream worker failed: {part['error']}")
            parts.append(part)
        wall = time.monotonic() - wall0
        cores = [round((_cpu_s(pid) - c) / wall, 2) for pid, c in zip(pids, cpu0, strict=True)]
        busy = gpu()
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 30)
            if p.is_alive():
                p.kill()
    row = summarise(n, parts, wall)
    row["workers"], row["model_processes"] = workers, len(paths)
    row["model_process_cores_busy"] = cores
    row["worker_cores_busy"] = [round(p["cpu_s"] / p["wall_s"], 2) for p in parts]
    row["worker_loop_lag_p99_ms"] = row.pop("loop_lag_p99_ms")
    row["gpu_busy_pct"] = busy
    if args.device.startswith("cuda"):
        import pynvml

        with contextlib.suppress(Exception):
            pynvml.nvmlInit()
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
            row["gpu_memory_used_gb"] = round(info.used / 1e9, 1)
    row["meets_1s"], row["meets_3s"] = row["caption_p99_s"] <= 1.0, row["caption_p99_s"] <= 3.0
    return row


def bench_settings() -> Settings:
    settings = Settings()
    settings.server.max_streams = 1 << 20
    settings.server.max_streams_per_key = 1 << 20
    settings.server.request_timeout_s = 60
    return settings


SAMPLE_STACKS: Path | None = None


def _stack_sampler() -> Any:
    """Where every thread is, every 2 ms: the innermost frames, counted (what the event loop does when it lags)."""
    import collections
    import threading
    import traceback

    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    stop = threading.Event()
    names = {}

    def sample() -> None:
        while not stop.wait(0.002):
            names.update({t.ident: t.name for t in threading.enumerate()})
            for ident, frame in sys._current_frames().items():
                if ident == threading.get_ident():
                    continue
                summary = traceback.extract_stack(frame)[-7:]
                key = " <- ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in reversed(summary))
                counts[names.get(ident, str(ident))][key] += 1

    threading.Thread(target=sample, daemon=True).start()

    def done() -> str:
        stop.set()
        out = []
        for thread, c in counts.items():
            total = sum(c.values())
            out.append(f"== {thread} ({total} samples)")
            out += [f"{n / total:6.1%}  {k}" for k, n in c.most_common(12)]
        return "\n".join(out)

    return done


def _gpu_sampler() -> Any:
    """Mean GPU utilisation over the run (NVML, where it is installed)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return lambda: None
    samples: list[int] = []
    import threading

    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    threading.Thread(target=sample, daemon=True).start()

    def done() -> float | None:
        stop.set()
        return round(float(np.mean(samples)), 1) if samples else None

    return done


async def sweep(args: argparse.Namespace, asr_model: Any, mt_model: Any, *, baseline: bool,
                counts: list[int], rows: list[dict[str, Any]], on_row: Any = None,
                workers: int = 0) -> list[dict[str, Any]]:
    audio = speech_like(args.seconds * 4, seed=1)
    for n in counts:
        asr, mt = build_runners(args, asr_model, mt_model, baseline=baseline)
        settings = bench_settings()
        # in one process the streams' SLO breakers hear the engine's stage latencies; sharded, each worker's own do
        breakers = None if workers else BreakerSupervisor(settings)
        executor = Executor(None, settings, max_batch=args.max_batch, max_queue=1 << 16,  # type: ignore[arg-type]
                            backends={"asr": lambda _k, r=asr: r, "mt": lambda _k, r=mt: r,
                                      "vad": lambda _k: energy_vad(args.device)}, observer=breakers)
        if workers:
            row = await run_sharded(executor, n, workers, args.seconds, args.chunk_ms, args.slo, audio)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                row = await run_streams(executor, breakers, n, args.seconds, args.chunk_ms, args.slo, audio,
                                        Path(tmp))
        row["asr_encoded"], row["asr_reused_encodings"] = asr.encoded, asr.reused
        row["asr_preemptions"] = asr.engine.preemptions
        await executor.close()
        asr.close()
        mt.close()
        if args.device.startswith("cuda"):
            row["gpu_peak_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
        del executor, asr, mt
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        row["meets_1s"], row["meets_3s"] = row["caption_p99_s"] <= 1.0, row["caption_p99_s"] <= 3.0
        label = "baseline " if baseline else (f"sharded{workers} " if workers else "batched  ")
        print(label + json.dumps(row), flush=True)
        rows.append(row)
        if on_row is not None:
            on_row()
        if not row["meets_3s"] or row["finals"] == 0:
            break
    return rows


def best(rows: list[dict[str, Any]], key: str) -> int:
    return max((r["streams"] for r in rows if r[key] and r["finals"]), default=0)


@torch.inference_mode()
def decoder_figures(args: argparse.Namespace, asr_model: Any, batches: list[int]) -> list[dict[str, Any]]:
    """Figure 3: decoder tokens/s and step latency, ours (paged, continuous engine) vs Hugging Face's decoder with
    its own KV cache (what ``generate`` runs for greedy search), same batch, same model; encoder audio-s/s."""
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    enc = hf_whisper_encoder(asr_model)
    frames, new = 600, 32  # 6 s windows, 32 tokens each
    rows = []
    for b in batches:
        mel = torch.randn(b, 80, frames, device=dev, dtype=args.dtype)
        enc(mel)  # warm-up: kernels and cuBLAS plans for this shape
        sync()
        t = time.perf_counter()
        memory = enc(mel)
        sync()
        enc_s = time.perf_counter() - t
        row: dict[str, Any] = {}
        tokens: dict[str, list[list[int]]] = {}
        for kernel in ("torch", "triton", "graphs") if dev.startswith("cuda") else ("torch",):
            _decode_once(args, asr_model, memory, b, new, kernel=kernel, profile=None)  # warms the shapes up
            got = _decode_once(args, asr_model, memory, b, new, kernel=kernel,
                               profile=args.profile if b == batches[-1] and kernel == "graphs" else None)
            tokens[kernel] = got.pop("tokens")
            row.update({k if k.startswith(("hf", "batch", "steps")) else f"{k}_{kernel}": v for k, v in got.items()})
        if "graphs" in tokens:  # fp16 ties can flip an argmax between kernels: report how often they agree
            row["graphs_tokens_equal_eager"] = round(float(np.mean([a == g for a, g in zip(
                tokens["triton"], tokens["graphs"], strict=True)])), 3)
        row["encoder_audio_s_per_s"] = round(b * 6 / enc_s)
        print("decoder " + json.dumps(row), flush=True)
        rows.append(row)
    return rows


@torch.inference_mode()
def _decode_once(args: argparse.Namespace, asr_model: Any, memory: torch.Tensor, b: int, new: int, *,
                 kernel: str, profile: Path | None) -> dict[str, Any]:
    from lingua_fusion.serving.gpu.decoder import DecodeEngine

    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    engine = DecodeEngine(HFWhisperDecoder(asr_model), blocks=max(64, b * 4 + 8), block_size=16,
                          cross_blocks=b * 5 + 8, cross_block_size=64, max_batch=b, dtype=args.dtype, device=dev,
                          kernel="triton" if kernel == "graphs" else kernel)
    if kernel == "graphs":
        from lingua_fusion.serving.gpu.graphs import buckets_up_to

        engine.use_graphs(buckets_up_to(b))
    futures = []
    for i in range(b):
        cid = engine.add_memory(memory[i])
        futures.append(engine.submit(SOT, cid, max_new=new, stop=frozenset()))
        engine.release(cid)
    engine.step()  # admission + first step
    if profile is not None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.step()
            sync()
        profile.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    sync()
    t = time.perf_counter()
    steps = 0
    while not engine.idle():
        engine.step()
        steps += 1
    sync()
    ours_s = time.perf_counter() - t
    # Hugging Face: the same decoder through its own forward and DynamicCache, one token per step
    dec_in = torch.tensor([SOT] * b, device=dev)
    out = asr_model(encoder_outputs=(memory,), decoder_input_ids=dec_in, use_cache=True)
    cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        out = asr_model(encoder_outputs=(memory,), decoder_input_ids=tok, past_key_values=cache, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    hf_s = time.perf_counter() - t
    return {"batch": b, "steps": steps, "ours_tokens_per_s": round(b * steps / ours_s),
            "ours_step_ms": round(ours_s / steps * 1000, 2), "hf_tokens_per_s": round(b * steps / hf_s),
            "hf_step_ms": round(hf_s / steps * 1000, 2), "tokens": [f.result().tokens for f in futures]}


@torch.inference_mode()
def kernel_check(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """The Triton paged attention against the reference path on random pools (self and cross block sizes)."""
    from lingua_fusion.serving.gpu.blocks import BlockPool
    from lingua_fusion.serving.gpu.paged import Gather

    out: dict[str, Any] = {}
    for bs, lengths in ((16, [1, 7, 16, 17, 40, 448]), (64, [3, 64, 65, 300, 750, 1500])):
        pool = BlockPool(4096, bs)
        ref = PagedKV(pool, 1, 8, 64, dtype=dtype, device=device, kernel="torch")
        tri = PagedKV(pool, 1, 8, 64, dtype=dtype, device=device, kernel="triton")
        tri.k, tri.v = ref.k, ref.v
        ref.k.normal_()
        ref.v.normal_()
        for seq, n in enumerate(lengths):
            pool.allocate(seq, n)
        q = torch.randn(len(lengths), 8, 1, 64, device=device, dtype=dtype)
        g = Gather.build(pool, list(range(len(lengths))), lengths, torch.device(device))
        out[f"max_abs_diff_block{bs}"] = float((ref.attend(0, q, g) - tri.attend(0, q, g)).abs().max())
    out["agree"] = all(v < 2e-2 for v in out.values())
    return out


@torch.inference_mode()
def memory_figures(args: argparse.Namespace, asr_model: Any, n: int) -> dict[str, Any]:
    """Figure 2: n concurrent decodes of 6 s windows: the paged pools' peak against naive per-stream
    preallocation at maximum length (448 tokens of self-attention, 1,500 frames of cross-attention)."""
    from lingua_fusion.serving.gpu.decoder import DecodeEngine

    adapter = HFWhisperDecoder(asr_model)
    per_token = PagedKV.bytes_per_token(adapter.n_layer, adapter.n_head, adapter.head_dim, args.dtype)
    naive = n * (448 + 1500) * per_token
    engine = DecodeEngine(adapter, blocks=n * 8 + 8, block_size=16, cross_blocks=n * 5 + 8, cross_block_size=64,
                          max_batch=n, dtype=args.dtype, device=args.device)
    memory = torch.randn(300, asr_model.config.d_model, device=args.device, dtype=args.dtype)
    peak_self = peak_cross = 0
    frag = []
    for _ in range(n):
        cid = engine.add_memory(memory)
        engine.submit(SOT, cid, max_new=40, stop=frozenset())
        engine.release(cid)
    while not engine.idle():
        engine.step()
        st = engine.stats()
        peak_self, peak_cross = max(peak_self, st.self_blocks_used), max(peak_cross, st.cross_blocks_used)
        frag.append(st.fragmentation)
    paged = peak_self * 16 * per_token + peak_cross * 64 * per_token
    return {"streams": n, "bytes_per_token": per_token, "naive_bytes": naive, "paged_peak_bytes": paged,
            "saving": round(1 - paged / naive, 3), "self_pool_fragmentation_mean": round(float(np.mean(frag)), 3),
            "pools_allocated_bytes": engine.kv.nbytes + engine.cross.nbytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--asr", default="base", choices=sorted(ASR_SIZES))
    ap.add_argument("--streams", default="250,500,1000,2000,4000,8000,12800")
    ap.add_argument("--baseline-streams", default="1,2,4,8,16,32,64")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--chunk-ms", type=int, default=500)
    ap.add_argument("--slo", default="interactive")
    ap.add_argument("--max-batch", type=int, default=2048)
    ap.add_argument("--asr-self-gb", type=float, default=8.0)
    ap.add_argument("--asr-cross-gb", type=float, default=40.0)
    ap.add_argument("--mt-gb", type=float, default=6.0)
    ap.add_argument("--kernel", default="auto", help="paged attention: auto (Triton on CUDA), triton or torch")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="decode steps without CUDA graphs")
    ap.add_argument("--encoder-graphs", default="asr,mt", choices=["asr,mt", "asr", "mt", ""],
                    help="which encoders replay from CUDA graphs (the others launch their operators one by one)")
    ap.add_argument("--no-encoder-graphs", dest="encoder_graphs", action="store_const", const="",
                    help="the same as --encoder-graphs ''")
    ap.add_argument("--sample-stacks", type=Path, help="write where each thread spent the last stream run here")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval (this process and the multi part's model processes): how long a "
                         "thread holds Python's lock before handing it over")
    ap.add_argument("--profile", type=Path, help="write a torch.profiler table of one decoder step at the largest "
                                                  "decoder batch here")
    ap.add_argument("--decoder-batches", default="1,32,256,1024")
    ap.add_argument("--parts", default="decoder,memory,baseline,streams",
                    help="any of decoder, memory, baseline, streams, sharded, multi")
    ap.add_argument("--warmup", type=int, default=0,
                    help="streams of an unrecorded 6 s run before the sweeps (and one in the multi part's "
                         "own processes)")
    ap.add_argument("--workers", type=int, default=4, help="stream worker processes of the 'sharded' part")
    ap.add_argument("--sharded-streams", default="100,200,300,400,600,800,1200")
    ap.add_argument("--model-processes", type=int, default=4, help="model processes of the 'multi' part")
    ap.add_argument("--multi-workers", type=int, default=8, help="stream worker processes of the 'multi' part")
    ap.add_argument("--multi-streams", default="300,600,900,1200,1600,2400")
    ap.add_argument("--trace-at", type=int, default=0,
                    help="streams of the 'multi' run during which model process 0 records a torch.profiler window")
    ap.add_argument("--trace-dir", type=Path, default=Path("gpu_trace"), help="where that window is written")
    ap.add_argument("--trace-seconds", type=float, default=2.0)
    ap.add_argument("--mps", action="store_true",
                    help="run under NVIDIA MPS (bench/mps.py): the run's processes share one GPU context")
    ap.add_argument("--quick", action="store_true", help="tiny models and counts (a CPU check of the code)")
    args = ap.parse_args()
    stop_mps = None
    if args.mps:  # before this process first touches CUDA; the processes it spawns inherit the daemon's address
        import mps

        stop_mps = mps.start()
        atexit.register(stop_mps)  # also when the run fails; a second quit finds no daemon and does nothing
    args.dtype = torch.float16 if args.device.startswith("cuda") else torch.float32
    if args.quick:
        args.asr, args.asr_self_gb, args.asr_cross_gb, args.mt_gb = "tiny", 0.2, 0.4, 0.1
    parts = set(args.parts.split(","))
    global SAMPLE_STACKS
    SAMPLE_STACKS = args.sample_stacks
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
                              "weights": "random", "asr_architecture": f"whisper-{args.asr} (HF)",
                              "mt_architecture": "marian opus-mt size" if not args.quick else "marian tiny",
                              "output_lengths": "speech 3 tokens/s + 4; translation source length + 4",
                              "vad": "energy on the GPU (Silero runs on the CPU only there)",
                              "chunk_ms": args.chunk_ms, "seconds": args.seconds, "slo_class": args.slo,
                              "switch_interval_s": sys.getswitchinterval() if args.switch_interval is None
                              else args.switch_interval,
                              "torch": torch.__version__, "cpu_cores": os.cpu_count(), "mps": args.mps}
    t0 = time.monotonic()
    asr_model = whisper(args.asr, args.device, args.dtype)
    mt_model = marian(args.device, args.dtype, small=args.quick)
    if args.device.startswith("cuda") and args.kernel != "torch":
        report["kernel_check"] = kernel_check(args.device, args.dtype)
        print("kernel " + json.dumps(report["kernel_check"]), flush=True)
        if not report["kernel_check"]["agree"]:
            args.kernel = "torch"  # never measure a kernel that gives other answers
    report["kernel"], report["cuda_graphs"] = args.kernel, args.graphs and args.device.startswith("cuda")
    report["encoder_graphs"] = sorted(encoder_graph_parts(args)) if report["cuda_graphs"] else []
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every part, so a run cut short by its time limit still leaves what it measured
        report["wall_s"] = round(time.monotonic() - t0, 1)
        args.json.write_text(json.dumps(report, indent=2))
    if args.warmup:  # Triton compiles and first-shape work land here, not in the first recorded run; every later
        # build captures its own encoder graphs, so this throwaway one takes none (about 336 captures saved)
        asyncio.run(sweep(argparse.Namespace(**{**vars(args), "seconds": 6.0, "encoder_graphs": ""}), asr_model,
                          mt_model, baseline=False, counts=[args.warmup], rows=[]))
    if "decoder" in parts:
        report["decoder"] = decoder_figures(args, asr_model, [int(b) for b in args.decoder_batches.split(",")])
        save()
    if "memory" in parts:
        report["memory_1000_streams"] = memory_figures(args, asr_model, 1000 if not args.quick else 50)
        print("memory " + json.dumps(report["memory_1000_streams"]), flush=True)
        save()
    if "baseline" in parts:
        rows = report["baseline_runs"] = []
        asyncio.run(sweep(args, asr_model, mt_model, baseline=True,
                          counts=[int(c) for c in args.baseline_streams.split(",")], rows=rows, on_row=save))
        report["baseline_streams_p99_1s"], report["baseline_streams_p99_3s"] = best(rows, "meets_1s"), \
            best(rows, "meets_3s")
        save()
    if "streams" in parts:
        rows = report["runs"] = []
        asyncio.run(sweep(args, asr_model, mt_model, baseline=False,
                          counts=[int(c) for c in args.streams.split(",")], rows=rows, on_row=save))
        report["streams_p99_1s"], report["streams_p99_3s"] = best(rows, "meets_1s"), best(rows, "meets_3s")
    if "sharded" in parts:
        rows = report["sharded_runs"] = []
        report["sharded_workers"] = args.workers
        asyncio.run(sweep(args, asr_model, mt_model, baseline=False, workers=args.workers,
                          counts=[int(c) for c in args.sharded_streams.split(",")], rows=rows, on_row=save))
        report["sharded_streams_p99_1s"] = best(rows, "meets_1s")
        report["sharded_streams_p99_3s"] = best(rows, "meets_3s")
        save()
    if "multi" in parts:
        rows = report["multi_runs"] = []
        report["multi_model_processes"], report["multi_workers"] = args.model_processes, args.multi_workers
        audio = speech_like(args.seconds * 4, seed=1)

        def on_multi(row: dict[str, Any]) -> None:
            print(f"multi{args.model_processes}x{args.multi_workers} " + json.dumps(row), flush=True)
            rows.append(row)
            save()

        asyncio.run(run_multi(args, [int(c) for c in args.multi_streams.split(",")], args.multi_workers,
                              args.model_processes, audio, on_multi))
        report["multi_streams_p99_1s"] = best(rows, "meets_1s")
        report["multi_streams_p99_3s"] = best(rows, "meets_3s")
        save()
    if "streams_p99_1s" in report and report.get("baseline_streams_p99_1s"):
        report["ratio_p99_1s"] = round(report["streams_p99_1s"] / report["baseline_streams_p99_1s"], 1)
    if "streams_p99_3s" in report and report.get("baseline_streams_p99_3s"):
        report["ratio_p99_3s"] = round(report["streams_p99_3s"] / report["baseline_streams_p99_3s"], 1)
    if stop_mps is not None:
        report["mps_control_log"] = stop_mps()["control_log_tail"]
    save()
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, list)}, indent=2))


if __name__ == "__main__":
    main()
