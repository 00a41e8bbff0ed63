"""NVIDIA MPS for one benchmark run: every process of the run shares one GPU context, so their kernels can run at
the same time instead of taking turns (the GPU time-slices separate processes' contexts).

``start()`` runs the MPS control daemon with its pipe and log directories in a fresh temporary directory and points
this process (and so every process it starts afterwards) at it through ``CUDA_MPS_PIPE_DIRECTORY`` /
``CUDA_MPS_LOG_DIRECTORY``; only processes with those variables use it, others on the machine keep the GPU as it
was. It changes none of the card's settings (compute mode, clocks, MIG). ``stop()`` quits the daemon (and with it
its server). Call ``start()`` before CUDA is first used in this process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"


def start() -> Callable[[], dict[str, str]]:
    if shutil.which(CONTROL) is None:
        raise SystemExit(f"--mps: {CONTROL} is not on this machine")
    root = Path(tempfile.mkdtemp(prefix="lf-mps-"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for d in env.values():
        Path(d).mkdir()
    subprocess.run([CONTROL, "-d"], env={**os.environ, **env}, check=True, timeout=30)
    os.environ.update(env)

    def stop() -> dict[str, str]:
        """Quit the daemon; returns the tail of its control log (whether a server ran, and for which clients)."""
        subprocess.run([CONTROL], input=b"quit\n", env={**os.environ, **env}, timeout=30, check=False)
        log = root / "log" / "control.log"
        tail = log.read_text(errors="replace").splitlines()[-12:] if log.exists() else []
        return {"control_log_tail": "\n".join(tail)}

    return stop
