"""The decode step's host bookkeeping against its batch: what one engine core per GPU would pay per step in Python.

    .venv/bin/python bench/step_host.py --json bench/results/step_host.json [--batches 64,256,1024]

``DecodeEngine.step`` (serving/gpu/decoder.py) does two things: the model's forward (on a GPU, one CUDA graph
replay) and, around it, per-row Python: admission into the running batch, prefix sharing, a KV slot per row, the
step's input arrays, and reading each row's token back. This runs the engine on the CPU over the tests' tiny decoder
(tests/gpu_models.py: its forward is cheap, so the bookkeeping shows) with ``batch`` sequences running, and times
the whole step and the forward alone; the difference is the host's share, which a GPU does not shorten. Printed and
written to ``--json``: per batch, ms a step, ms of it in the forward, ms of bookkeeping and microseconds a row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gpu_models import TinyWhisper  # noqa: E402

from lingua_fusion.serving.gpu.decoder import DecodeEngine  # noqa: E402
from lingua_fusion.serving.gpu.models import WhisperDecoder  # noqa: E402
from lingua_fusion.serving.gpu.paged import DeviceInputs  # noqa: E402


def measure(batch: int, steps: int) -> dict[str, Any]:
    model = TinyWhisper()
    engine = DecodeEngine(WhisperDecoder(model), blocks=batch * 8 + 64, block_size=16, cross_blocks=batch * 2 + 8,
                          cross_block_size=16, max_batch=batch, dtype=torch.float32, device="cpu", kernel="torch")
    for _ in range(batch):  # every sequence a 20-frame window of its own, a 3-token prompt, 60 tokens out
        cid = engine.add_memory(torch.randn(20, model.dims.n_text_state))
        assert cid is not None  # the cross pool is sized for every window
        engine.submit([1, 2, 3], cid, max_new=60, stop=frozenset({-1}))
        engine.release(cid)
    for _ in range(5):  # the prompts read, every row generating
        engine.step()
    forward, in_forward = engine.forward, [0.0]

    def timed(x: DeviceInputs) -> tuple[torch.Tensor, torch.Tensor]:
        t = time.perf_counter()
        out = forward(x)
        in_forward[0] += time.perf_counter() - t
        return out

    engine.forward = timed  # type: ignore[method-assign]
    t0 = time.perf_counter()
    for _ in range(steps):
        assert engine.step() == batch
    step_ms = 1000 * (time.perf_counter() - t0) / steps
    forward_ms = 1000 * in_forward[0] / steps
    host_ms = step_ms - forward_ms
    return {"batch": batch, "step_ms": round(step_ms, 3), "forward_ms": round(forward_ms, 3),
            "host_ms": round(host_ms, 3), "host_us_per_row": round(1000 * host_ms / batch, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="16,64,256,1024")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", type=Path, default=Path("step_host.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        row = measure(b, args.steps)
        rows.append(row)
        print(f"batch {row['batch']:>5}: step {row['step_ms']:.2f} ms, forward {row['forward_ms']:.2f} ms, host "
              f"{row['host_ms']:.2f} ms ({row['host_us_per_row']:.2f} us a row)", flush=True)
    args.json.write_text(json.dumps({"bench": "step_host", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                     "device": "cpu", "torch_threads": 1, "steps": args.steps, "rows": rows},
                                    indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
