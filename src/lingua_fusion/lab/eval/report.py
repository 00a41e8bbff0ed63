"""HTML reports with matplotlib plots (PNG files next to the HTML)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from .results import StudyResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _plt() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt: ModuleType, fig: Figure, ax: Axes, out: Path) -> Path:
    """Grid, legend, tight layout, write the PNG, free the figure."""
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_study(study: StudyResult, out: Path) -> Path:
    plt = _plt()
    rows = study["rows"]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(x, [r["bleu"] for r in rows], "o-", label="BLEU")
    ax.plot(x, [r["wer"] * 100 for r in rows], "s-", label="WER x100")
    ax.plot(x, [r["joint"] for r in rows], "^-", label=f"BLEU - {study['a']}*WER*100")
    ax.set_xticks(x, [str(r["level"]) for r in rows])
    ax.set_xlabel(study["axis"])
    ax.set_title(f"{study['study']} ({study['path']}): knee {study['knee']['from_level']} -> "
                 f"{study['knee']['to_level']} (conf {study['knee']['confidence']})")
    return _finish(plt, fig, ax, out)


def plot_cdf(latencies: dict[str, list[float]], out: Path, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, values in latencies.items():
        if values:
            v = np.sort(values)
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
    ax.set_xlabel("caption latency (s)")
    ax.set_ylabel("fraction of captions")
    ax.set_title(title)
    return _finish(plt, fig, ax, out)


def plot_goodput(runs: Mapping[str, Sequence[Mapping[str, float]]], out: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, rows in runs.items():
        ax.plot([r["streams"] for r in rows], [r["goodput_streams"] for r in rows], "o-", label=label)
    ax.set_xlabel("offered streams")
    ax.set_ylabel("streams meeting their SLO")
    return _finish(plt, fig, ax, out)


def write_html(path: Path, title: str, report: Mapping[str, object], images: list[Path]) -> Path:
    summary = {k: v for k, v in report.items() if k not in ("paths", "studies", "runs", "streams_detail")}
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto}pre{background:#f4f4f4;"
             "padding:1em;overflow:auto}</style>", f"<h1>{html.escape(title)}</h1>"]
    for img in images:
        parts.append(f"<p><img src='{html.escape(img.name)}' alt='{html.escape(img.stem)}'></p>")
    parts.append("<h2>Report</h2><pre>" + html.escape(json.dumps(summary, indent=2, ensure_ascii=False)) + "</pre>")
    paths = report.get("paths")  # an eval report's PathResults
    if isinstance(paths, dict):
        parts.append("<h2>Quality per path</h2><table border=1 cellpadding=4><tr><th>path</th><th>items</th>"
                     "<th>BLEU</th><th>chrF</th><th>WER</th><th>latency p50 ms</th></tr>")
        for name, p in paths.items():
            parts.append(f"<tr><td>{name}</td><td>{p['items']}</td><td>{p['bleu']['score']}</td>"
                         f"<td>{p['chrf']['score']}</td><td>{p['wer']}</td><td>{p['latency_ms']['p50']}</td></tr>")
        parts.append("</table>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
