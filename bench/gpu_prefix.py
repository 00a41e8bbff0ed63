"""Prefix reuse in the GPU decode engine (issue 12), on the CPU: blocks and decode work saved for a mix of
glossary-prompted decodes, with the same arrivals run once with the prefix cache and once without.

    .venv/bin/python bench/gpu_prefix.py --json bench/results/gpu_prefix.json

The decoder is Whisper tiny's architecture (Hugging Face, 4 layers, d 384, the real 51,865-token vocabulary) with
random weights; encoder outputs are random frames (the engine never looks inside them). Random weights never emit
end-of-text, so each decode is capped at 3 tokens per second of audio + 4, as bench/gpu_streams.py does.

The mix: ``--streams`` streams, each decoding ``--windows`` audio windows of 3 s, one window after another; every
window is decoded ``--decodes`` times from the same audio (its last partial and its commit: the runner's memo gives
them one cross-attention entry), the later decodes ``--gap`` steps after the first. ``--glossary`` of the streams
carry the glossary prompt (``<|startofprev|>`` + ``--prompt-tokens`` term tokens + the 4 start tokens, the same for
every stream of the glossary), the others only the start tokens. A later decode of a window takes the prompt's
full blocks the earlier one has written, and sits out (``prefix_waits``) while the earlier one writes a block it
needs, then takes it. Reuse is exact only within one audio window
(serving/gpu/decoder.py says why), so the same glossary over different windows saves nothing; ``--decodes 1`` shows
that.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lingua_fusion.serving.gpu.decoder import DecodeEngine  # noqa: E402
from lingua_fusion.serving.gpu.models import HFWhisperDecoder  # noqa: E402

SOT = [50258, 50259, 50359, 50363]  # start, language, transcribe, no timestamps
PREV = 50361  # <|startofprev|>
AUDIO_S, FRAMES_PER_S = 3.0, 50


def tiny_whisper() -> Any:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=1, decoder_layers=4,
                        encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
                        decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
                        pad_token_id=50256, bos_token_id=50257, eos_token_id=50256, decoder_start_token_id=50257)
    return WhisperForConditionalGeneration(cfg).eval()


def arrivals(args: argparse.Namespace) -> list[tuple[int, int, int, list[int], bool]]:
    """(step, stream, window, prompt, tentative), in step order."""
    rng = random.Random(1)
    glossary = [PREV] + [rng.randint(400, 50000) for _ in range(args.prompt_tokens)] + SOT
    out = []
    for s in range(args.streams):
        prompt = glossary if s < args.glossary else SOT
        for w in range(args.windows):
            start = w * args.window_steps + rng.randint(0, args.window_steps // 2)
            for d in range(args.decodes):
                out.append((start + d * args.gap, s, w, prompt, d < args.decodes - 1))
    return sorted(out, key=lambda a: a[0])


def run(decoder: HFWhisperDecoder, args: argparse.Namespace, *, prefix_cache: bool) -> dict[str, Any]:
    engine = DecodeEngine(decoder, blocks=args.blocks, block_size=16, cross_blocks=4096, cross_block_size=64,
                          max_batch=512, prefix_cache=prefix_cache)
    gen = torch.Generator().manual_seed(2)
    frames = int(AUDIO_S * FRAMES_PER_S)
    cids: dict[tuple[int, int], int] = {}
    left = {key: 0 for key in ((s, w) for _, s, w, _, _ in arrivals(args))}
    for _, s, w, _, _ in arrivals(args):
        left[(s, w)] += 1
    todo, futures, peak, t0, step = arrivals(args), [], 0, time.perf_counter(), 0
    max_new = int(AUDIO_S * 3) + 4
    while todo or not engine.idle():
        while todo and todo[0][0] <= step:
            _, s, w, prompt, tentative = todo.pop(0)
            if (s, w) not in cids:  # the window's encoder output, as the runner's memo keeps it
                cid = engine.add_memory(torch.randn(frames, 384, generator=gen))
                assert cid is not None
                cids[(s, w)] = cid
            fut = engine.submit(prompt, cids[(s, w)], max_new=max_new, stop=frozenset(), tentative=tentative)
            left[(s, w)] -= 1
            if not left[(s, w)]:
                engine.release(cids[(s, w)])  # the memo forgets it; its decodes hold their own references
            futures.append(fut)
        engine.step()
        step += 1
        peak = max(peak, engine.stats().self_blocks_used)
    stats = engine.stats()
    return {"prefix_cache": prefix_cache, "engine_steps": stats.steps, "tokens_fed": stats.tokens,
            "prompt_tokens_reused": stats.prefix_tokens, "prefix_hits": stats.prefix_hits,
            "prefix_waits": stats.prefix_waits,
            "peak_self_blocks": peak, "preemptions": stats.preemptions, "wall_s": round(time.perf_counter() - t0, 2),
            "left_used": stats.self_blocks_used, "left_cached": stats.self_blocks_cached,
            "outputs": [f.result().tokens for f in futures]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--streams", type=int, default=24)
    ap.add_argument("--glossary", type=int, default=16, help="how many of the streams carry the glossary prompt")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--decodes", default="1,2,3", help="decodes per audio window (a run for each)")
    ap.add_argument("--gap", type=int, default=8, help="steps between decodes of one window")
    ap.add_argument("--window-steps", type=int, default=60)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--blocks", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(1)
    decoder = HFWhisperDecoder(tiny_whisper())
    runs = []
    for decodes in [int(d) for d in args.decodes.split(",")]:
        args.decodes = decodes
        off = run(decoder, args, prefix_cache=False)
        on = run(decoder, args, prefix_cache=True)
        same = on.pop("outputs") == off.pop("outputs")
        runs.append({"decodes_per_window": decodes, "sequences": args.streams * args.windows * decodes,
                     "same_tokens": same, "without": off, "with": on,
                     "tokens_fed_saved": off["tokens_fed"] - on["tokens_fed"],
                     "engine_steps_saved": off["engine_steps"] - on["engine_steps"],
                     "peak_blocks_saved": off["peak_self_blocks"] - on["peak_self_blocks"]})
        print(json.dumps(runs[-1]), flush=True)
    args.decodes = None
    report = {"bench": "gpu_prefix", "device": "cpu", "weights": "random",
              "model": "whisper-tiny decoder architecture (4 layers, d 384, vocab 51865)", "block_size": 16,
              "prompt_len": args.prompt_tokens + 5, "config": {k: v for k, v in vars(args).items() if k != "json"},
              "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "python": platform.python_version(),
                          "torch": torch.__version__},
              "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
