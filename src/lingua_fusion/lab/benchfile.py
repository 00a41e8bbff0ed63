"""In-process file benchmark: cold vs warm latency per stage and real-time factor (``linguafusion bench``)."""

from __future__ import annotations

import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, TypedDict

from ..files import FileRequest, FileTranslator
from ..sdk.common import read_input


class _Run(TypedDict):
    wall_ms: float
    stages_ms: dict[str, float]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except OSError:
        return "unknown"


def run_file_bench(path: Path, *, to: str, source_lang: str | None, target_modality: str = "text",
                   repeat: int = 3, engine: FileTranslator | None = None) -> dict[str, Any]:
    data, text, modality, name = read_input(str(path), None, None)
    eng = engine or FileTranslator()
    runs: list[_Run] = []
    for _ in range(max(1, repeat) + 1):
        t = time.perf_counter()
        r = eng.translate(FileRequest(source_modality=modality, target_lang=to, target_modality=target_modality,
                                      source_lang=source_lang, data=data, text=text, filename=name))
        runs.append(_Run(wall_ms=round((time.perf_counter() - t) * 1000, 1), stages_ms=r.latency_ms))
    duration = r.duration_s
    warm = runs[1:]
    med = statistics.median(x["wall_ms"] for x in warm)
    stages = {k: round(statistics.median(x["stages_ms"].get(k, 0.0) for x in warm), 1) for k in warm[0]["stages_ms"]}
    return {
        "schema": "linguafusion.bench.file/1", "commit": _commit(), "machine": platform.platform(),
        "cpus": len(__import__("os").sched_getaffinity(0)), "file": str(path), "modality": modality,
        "target_lang": to, "target_modality": target_modality, "media_seconds": duration,
        "cold_ms": runs[0]["wall_ms"], "cold_stages_ms": runs[0]["stages_ms"], "warm_median_ms": med,
        "warm_stages_median_ms": stages,
        "rtf_warm": round(med / 1000 / duration, 4) if duration else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "models": r.models, "text": r.text,
    }
