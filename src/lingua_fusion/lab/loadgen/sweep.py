"""Sweeps over offered load, the knee search, the report, and comparison of two reports."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx

from ...errors import BackendError
from ..fixtures import git_commit, machine
from .mix import Mix
from .run import run_load

SCHEMA = "linguafusion.bench.load/1"


async def sweep(url: str, api_key: str | None, mix: Mix, counts: list[int], duration: float, *, seed: int,
                baseline: bool, knee: bool, console: Any, run_all: bool = False) -> dict[str, Any]:
    """Run each N in ``counts`` (ascending) until one misses its SLO; with ``knee``, binary-search between the last
    N that met it and the first that did not."""
    runs: list[dict[str, Any]] = []

    async def run(n: int) -> dict[str, Any]:
        restored = await restore_breakers(url, api_key)
        r = await run_load(url, api_key, mix, n, duration, seed=seed, baseline=baseline)
        r["breaker_restored"] = restored  # False: this row may start with the last row's breaker still refusing
        console.print(f"  {'baseline ' if baseline else ''}n={n}: goodput {r['goodput_streams']}/{n}, "
                      + ", ".join(f"{slo} p99 {c['caption_latency_s']['p99']} s" for slo, c in r["classes"].items())
                      + f", meets SLO: {r['meets_slo']}", markup=False)
        runs.append(r)
        return r

    last_ok, first_bad = 0, None
    for n in sorted(counts):
        r = await run(n)
        if r["meets_slo"]:
            if first_bad is None:
                last_ok = n
        else:
            first_bad = first_bad or n
            if not run_all:
                break
    if knee and first_bad is not None:
        lo, hi = last_ok, first_bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if (await run(mid))["meets_slo"]:
                lo = mid
            else:
                hi = mid
        last_ok = lo
    runs.sort(key=lambda r: r["streams"])
    return {"knee_streams": last_ok, "first_failing_streams": first_bad, "runs": runs}


RESTORE_SETTLE_S = 1.5  # every worker of the server restores within a second of the reset (stream/supervisor.py)


async def restore_breakers(url: str, api_key: str | None) -> bool:
    """Each row starts from a server whose SLO breakers are at level 0 (``DELETE /v1/admin/breaker``), not from
    the last row's overload: without it, a row after an overloaded one was refused whole within the breaker's
    quiet period and the sweep read that as capacity. Needs an admin key (or a server without auth); False when
    the server refused or lacks the route, and the row goes on as before."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.delete(url.rstrip("/") + "/v1/admin/breaker", headers=headers)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        return False
    await asyncio.sleep(RESTORE_SETTLE_S)
    return True


def build_report(url: str, mix: Mix, mix_path: Path | None, counts: list[int], duration: float, seed: int,
                 ours: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "schema": SCHEMA, "commit": git_commit(), "machine": machine(), "url": url,
        "config": {"streams": counts, "duration_s": duration, "seed": seed, "mix": str(mix_path or "default"),
                   "arrival": mix.arrival, "ramp_s": mix.ramp_s,
                   "kinds": [vars(k) for k in mix.kinds]},
        "knee_streams": ours["knee_streams"], "runs": ours["runs"],
    }
    if base is not None:
        rep["baseline"] = {"knee_streams": base["knee_streams"], "runs": base["runs"]}
        rep["ratio_vs_baseline"] = (round(ours["knee_streams"] / base["knee_streams"], 2)
                                    if base["knee_streams"] else None)
    return rep


PROBE_S = 10.0  # for the server's /healthz before a load run

def check_server(url: str, timeout_s: float = PROBE_S) -> None:
    """A load run against no server measures nothing (it used to report goodput 0 and exit 0): refuse it first,
    ``backend_unavailable``, when ``url`` has no LinguaFusion server answering /healthz."""
    try:
        r = httpx.get(url.rstrip("/") + "/healthz", timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise BackendError(f"no server answers at {url} ({exc}); start one (linguafusion serve) or check --url") \
            from exc
    if r.status_code != 200:
        raise BackendError(f"{url}/healthz answered {r.status_code}: is --url a LinguaFusion server?")


def run_bench_load(url: str, api_key: str | None, mix: Mix, mix_path: Path | None, counts: list[int],
                   duration: float, *, seed: int, baseline: bool, knee: bool, console: Any,
                   run_all: bool = False) -> dict[str, Any]:
    check_server(url)
    ours = asyncio.run(sweep(url, api_key, mix, counts, duration, seed=seed, baseline=False, knee=knee,
                             console=console, run_all=run_all))
    base = None
    if baseline:
        base = asyncio.run(sweep(url, api_key, mix, counts, duration, seed=seed, baseline=True, knee=knee,
                                 console=console, run_all=run_all))
    return build_report(url, mix, mix_path, counts, duration, seed, ours, base)


# ---- compare ---------------------------------------------------------------------------------------------------
HIGHER_IS_BETTER = ("knee_streams", "goodput_streams", "bleu", "chrf", "ratio_vs_baseline", "joint")
LOWER_IS_BETTER = ("p50", "p90", "p99", "p999", "wer", "cer", "rss_mib", "AL_ms", "LAAL_ms", "EndOffset_ms")


def _flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("latencies", "outputs", "machine", "config", "commit", "time", "rows"):
                continue
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            key = str(v.get("streams")) if isinstance(v, dict) and "streams" in v else str(i)
            out.update(_flatten(v, f"{prefix}[{key}]"))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        out[prefix] = float(obj)
    return out


def compare(a: dict[str, Any], b: dict[str, Any], tolerance: float = 0.10) -> dict[str, Any]:
    fa, fb = _flatten(a), _flatten(b)
    rows, regressions = [], []
    for key in sorted(set(fa) & set(fb)):
        x, y = fa[key], fb[key]
        parts = set(re.split(r"[.\[\]]", key))  # e.g. paths.text.bleu.score -> {"paths", "text", "bleu", ...}
        change = (y - x) / abs(x) if x else (0.0 if y == x else float("inf"))
        row = {"metric": key, "a": x, "b": y, "change": round(change, 4)}
        worse = (bool(parts & set(HIGHER_IS_BETTER)) and change < -tolerance) or (
            bool(parts & set(LOWER_IS_BETTER)) and change > tolerance)
        if worse:
            regressions.append(row)
        rows.append(row)
    return {"schema": "linguafusion.bench.compare/1", "tolerance": tolerance, "compared": len(rows),
            "regressions": regressions, "rows": rows}
