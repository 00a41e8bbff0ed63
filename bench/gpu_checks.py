"""What the CPU tests prove, checked again on CUDA: the batched Silero VAD and MT on the continuous engine.

    .venv/bin/python bench/gpu_checks.py prepare .gpurun/checks         # here: speech, Silero weights, references
    python3 bench/gpu_checks.py check .gpurun/checks --json $OUT/gpu_checks.json   # on the GPU machine
    python3 bench/gpu_checks.py check none --only encoder_graphs --json $OUT/graphs.json  # needs nothing prepared

- **Silero VAD** (serving/gpu/silero.py): ``prepare`` reads the weights from faster-whisper's ONNX file (the GPU
  machine has neither faster-whisper nor protobuf) and computes the probabilities of a set of calls with the torch
  port on this CPU (tests/service/test_gpu_silero.py holds those equal to onnxruntime's within 1e-4; 2.1e-6 measured);
  ``check`` runs the same calls on CUDA and compares, then times one call over many streams on CUDA against the
  same call on the machine's CPU cores (windows per second).
- **MT on the engine** (serving/gpu/torch_mt.py): a Marian of OPUS-MT's size with random weights (built there from
  a seed; a real one cannot travel) decoded by a GpuRunner against ``generate(num_beams=1)`` on the same device and
  dtype, token for token, in float32 and float16; and sentences per second of each at one batch size.
- **Encoder graphs** (serving/gpu/encoder_graphs.py): Whisper base's encoder from CUDA graphs against the same call
  operator by operator, shape by shape, and the host time of each per batch.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from lingua_fusion.serving.gpu.silero import WINDOW, SileroV6, silero_vad  # noqa: E402


def vad_calls(speech: np.ndarray) -> dict[str, list[np.ndarray]]:
    """Calls of the VAD lane to compare: one long stream; 64 streams of different lengths and offsets; noise."""
    rng = np.random.default_rng(7)
    streams = []
    for _ in range(64):
        start = int(rng.integers(0, len(speech) - 40 * WINDOW))
        streams.append(speech[start: start + int(rng.integers(1, 40)) * WINDOW + int(rng.integers(0, WINDOW))])
    return {"speech": [speech], "streams64": streams,
            "noise": [rng.normal(0, s, 30 * WINDOW).astype(np.float32) for s in (0.0, 0.01, 0.3)]}


def prepare(out: Path) -> None:
    from gpu_vad import speech as piper_speech

    out.mkdir(parents=True, exist_ok=True)
    speech = piper_speech()
    np.save(out / "speech.npy", speech)
    net = SileroV6.from_onnx()
    torch.save(net.state_dict(), out / "silero_v6.pt")
    run = silero_vad("cpu", net)
    refs = {f"{name}/{i}": p for name, calls in vad_calls(speech).items() for i, p in enumerate(run(calls))}
    np.savez(out / "silero_cpu.npz", **refs)
    print(f"prepared {out}: {len(speech) / 16000:.1f} s of speech, {len(refs)} reference streams")


def check_vad(folder: Path, device: str) -> dict[str, Any]:
    net = SileroV6()
    net.load_state_dict(torch.load(folder / "silero_v6.pt"))
    speech = np.load(folder / "speech.npy")
    refs = np.load(folder / "silero_cpu.npz")
    run = silero_vad(device, net)
    worst, flips, windows = 0.0, 0, 0
    for name, calls in vad_calls(speech).items():
        for i, got in enumerate(run(calls)):
            want = refs[f"{name}/{i}"]
            assert got.shape == want.shape, (name, i, got.shape, want.shape)
            worst = max(worst, float(np.abs(got - want).max(initial=0.0)))
            flips += int(((got >= 0.5) != (want >= 0.5)).sum())
            windows += len(want)
    cpu = silero_vad("cpu", copy.deepcopy(net).cpu())  # its own copy: .to() moves a module in place
    speed = []
    for n in (64, 512, 2048, 8192):
        chunk = [speech[(i * 7919) % (len(speech) - 16 * WINDOW):][: 16 * WINDOW] for i in range(n)]
        row: dict[str, Any] = {"streams": n, "windows": 16 * n}
        for label, fn in (("cuda", run), ("cpu", cpu)):
            if label == "cpu" and n > 2048:
                continue
            fn(chunk)  # warm-up (shapes, cuDNN's choice)
            times = []
            for _ in range(5):
                t = time.perf_counter()
                fn(chunk)
                times.append(time.perf_counter() - t)
            med = float(np.median(times))
            row[f"{label}_call_ms"] = round(med * 1000, 2)
            row[f"{label}_windows_per_s"] = round(16 * n / med)
        speed.append(row)
    return {"max_abs_diff_vs_cpu": worst, "decisions_flipped": flips, "windows_compared": windows,
            "cpu_threads": torch.get_num_threads(), "speed": speed}


def marian(seed: int, device: str, dtype: torch.dtype) -> Any:
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    vocab = 58101
    cfg = MarianConfig(vocab_size=vocab, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                       decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                       max_position_embeddings=512, pad_token_id=vocab - 1, eos_token_id=0,
                       decoder_start_token_id=vocab - 1, forced_eos_token_id=0)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():  # wider than the default init so the argmax is no near-tie everywhere; some end early
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed_positions" not in name:
                p.mul_(6.0)
        model.final_logits_bias[0, 0] = 4.0
    model.generation_config.max_length = None
    return model.to(device=device, dtype=dtype)


def check_mt(device: str, n: int = 256, max_new: int = 48) -> list[dict[str, Any]]:
    from lingua_fusion.serving.gpu.models import MarianDecoder
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.gpu.torch_mt import MtTokens, TorchSeq2SeqRecipe, greedy_plan

    rng = np.random.default_rng(3)
    texts = [[int(t) for t in rng.integers(1, 58000, int(rng.integers(4, 60)))] + [0] for _ in range(n)]
    rows = []
    for dtype in (torch.float32, torch.float16):
        model = marian(11, device, dtype)
        plan = greedy_plan(model)
        assert not isinstance(plan, str), plan
        plan = dataclasses.replace(plan, max_new=max_new)
        recipe = TorchSeq2SeqRecipe(model, MarianDecoder(model, suppress=plan.suppress), plan)
        runner = GpuRunner(recipe, blocks=8192, cross_blocks=2048, max_batch=512, dtype=dtype, device=device,
                           name="mt-check", graphs=device.startswith("cuda"))
        try:
            items = [MtTokens(tuple(t), (plan.start,)) for t in texts]
            runner.submit(items[:8], [False] * 8)[0].result(timeout=300)  # warm-up: graphs, Triton
            t = time.perf_counter()
            ours = [f.result(timeout=300) for f in runner.submit(items, [False] * n)]
            ours_s = time.perf_counter() - t
        finally:
            runner.close()
        pad = model.config.pad_token_id
        ids = torch.full((n, max(len(x) for x in texts)), pad, dtype=torch.long)
        for i, x in enumerate(texts):
            ids[i, : len(x)] = torch.tensor(x)
        mask = (ids != pad).long()
        with torch.no_grad():
            t = time.perf_counter()
            gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), num_beams=1,
                                 do_sample=False, max_new_tokens=max_new)
            torch.cuda.synchronize() if device.startswith("cuda") else None
            gen_s = time.perf_counter() - t
        theirs = []
        for row in gen.tolist():
            out = row[1:]
            theirs.append(out[: out.index(0)] if 0 in out else [x for x in out if x != pad])
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        prefix = [next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                  for a, b in zip(ours, theirs, strict=True)]
        rows.append({"dtype": str(dtype).removeprefix("torch."), "sentences": n, "identical": same,
                     "mean_tokens": round(float(np.mean([len(x) for x in theirs])), 1),
                     "mean_common_prefix": round(float(np.mean(prefix)), 1),
                     "engine_sentences_per_s": round(n / ours_s, 1), "generate_sentences_per_s": round(n / gen_s, 1)})
        print("mt " + json.dumps(rows[-1]), flush=True)
    return rows


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_calls(calls: dict[str, Any], rounds: int = 20) -> dict[str, dict[str, float]]:
    """Per call after 3 warm-up calls: the host's time to issue it, and the time until the GPU has run it."""
    out = {}
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        _sync()
        t = time.perf_counter()
        for _ in range(rounds):
            fn()
        host = (time.perf_counter() - t) / rounds
        _sync()
        out[name] = {"host_ms_per_batch": round(host * 1000, 3),
                     "wall_ms_per_batch": round((time.perf_counter() - t) / rounds * 1000, 3)}
    return out


def check_encoder_graphs(device: str, dtype: torch.dtype = torch.float16, size: str = "base") -> dict[str, Any]:
    """Whisper base's encoder (random weights, float16) replayed from CUDA graphs against the same call launched
    operator by operator: largest difference per shape (batches off the buckets, past the largest bucket, widths
    from 1 to 30 s), then host and wall time per batch of 64 windows of 10 s; then the same for Marian's."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_streams import asr_encoder_graphs, whisper

    from lingua_fusion.serving.gpu.recipes import hf_whisper_encoder

    model = whisper(size, device, dtype)
    eager = hf_whisper_encoder(model)
    t = time.perf_counter()
    graphed = asr_encoder_graphs(eager, device, dtype)
    graphed.capture_ahead()
    capture_s = time.perf_counter() - t
    gen = torch.Generator(device=device).manual_seed(0)
    rows, worst = [], 0.0
    with torch.inference_mode():
        for n, seconds in [(1, 1), (3, 7), (64, 10), (77, 30), (128, 2), (200, 5)]:
            mel = torch.randn(n, 80, seconds * 100, generator=gen, device=device).to(dtype)
            a, b = eager(mel), graphed(mel)
            first = b.clone()
            graphed(torch.randn_like(mel))  # a later call must not change what the first returned
            diff = float((a.float() - b.float()).abs().max())
            worst = max(worst, diff)
            rows.append({"batch": n, "seconds": seconds, "max_abs_diff": diff, "kept": torch.equal(b, first)})
        mel = torch.randn(64, 80, 1000, generator=gen, device=device).to(dtype)
        timing = time_calls({"eager": lambda: eager(mel), "graphs": lambda: graphed(mel)})
    return {"asr": {"shapes": rows, "max_abs_diff": worst, "capture_s": round(capture_s, 1),
                    "graphs": graphed.captured, "eager_calls_past_largest_bucket": graphed.eager,
                    "batch64_10s": timing},
            "mt": check_mt_encoder_graphs(device, dtype)}


def check_mt_encoder_graphs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """Marian (OPUS-MT size, random weights) through ``marian_encoder`` on CUDA graphs against Hugging Face's
    encoder (``encoder_outputs``), sentence by sentence, and the host time of each per batch of 64 sentences."""
    from gpu_streams import mt_encoder_graphs

    from lingua_fusion.serving.gpu.recipes import encoder_outputs, padded_ids

    model = marian(0, device, dtype)
    pad = model.config.pad_token_id
    t = time.perf_counter()
    graphed = mt_encoder_graphs(model, device)
    graphed.capture_ahead()
    capture_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    batches = [[list(map(int, rng.integers(1, 58000, size=int(n)))) for n in rng.integers(1, 96, size=b)]
               for b in (1, 3, 64, 128, 200)]
    dev = torch.device(device)
    worst = 0.0
    with torch.inference_mode():
        for ids in batches:
            want = encoder_outputs(model.model.encoder, ids, pad, dev)
            batch, mask = padded_ids(ids, pad, 8)
            got = graphed(batch.to(dev), mask.to(dev))
            worst = max(worst, max(float((got[i, : len(s)].float() - w.float()).abs().max())
                                   for i, (s, w) in enumerate(zip(ids, want, strict=True))))
        ids = batches[2]
        batch, mask = padded_ids(ids, pad, 8)
        timing = time_calls({"hugging_face": lambda: encoder_outputs(model.model.encoder, ids, pad, dev),
                             "graphs": lambda: graphed(batch.to(dev), mask.to(dev))})
    return {"max_abs_diff": worst, "capture_s": round(capture_s, 1), "graphs": graphed.captured,
            "eager_calls_past_largest_bucket": graphed.eager, "batch64": timing}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("folder", type=Path)
    c = sub.add_parser("check")
    c.add_argument("folder", type=Path)
    c.add_argument("--json", type=Path, required=True)
    c.add_argument("--device", default="cuda")
    c.add_argument("--sentences", type=int, default=256)
    c.add_argument("--only", default="vad,mt,encoder_graphs", help="which checks, comma-separated")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.folder)
        return
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
                              "torch": torch.__version__}
    only = set(args.only.split(","))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if "vad" in only:
        report["silero_vad"] = check_vad(args.folder, args.device)
        print("vad " + json.dumps(report["silero_vad"]), flush=True)
    if "mt" in only:
        report["mt_engine"] = check_mt(args.device, args.sentences)
        args.json.write_text(json.dumps(report, indent=2))
    if "encoder_graphs" in only:
        cuda = args.device.startswith("cuda")  # on a CPU: the same check in float32 at tiny size (a code check)
        report["encoder_graphs"] = check_encoder_graphs(args.device, torch.float16 if cuda else torch.float32,
                                                        "base" if cuda else "tiny")
        print("encoder graphs " + json.dumps(report["encoder_graphs"]), flush=True)
    args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
