"""HTML report of a load run: latency CDFs per offered load, goodput against offered load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..eval.report import plot_cdf, plot_goodput, write_html


def write_load_html(report: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    images = []
    lat = {f"n={r['streams']} {slo}": v for r in report["runs"] for slo, v in r["latencies"].items()}
    images.append(plot_cdf(lat, out.with_name(out.stem + "-cdf.png"), "caption latency CDF"))
    curves = {"batched": report["runs"]}
    if "baseline" in report:
        curves["per-stream baseline"] = report["baseline"]["runs"]
        base_lat = {f"baseline n={r['streams']} {slo}": v for r in report["baseline"]["runs"]
                    for slo, v in r["latencies"].items()}
        images.append(plot_cdf(base_lat, out.with_name(out.stem + "-cdf-baseline.png"), "baseline latency CDF"))
    images.append(plot_goodput(curves, out.with_name(out.stem + "-goodput.png")))
    return write_html(out, "LinguaFusion load report", report, images)
