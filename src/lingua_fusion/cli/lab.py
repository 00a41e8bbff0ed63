"""``linguafusion bench | chaos | eval``: the lab's commands (lingua_fusion.lab is imported inside them only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from ..errors import LinguaFusionError, NotConfigured
from .app import KEY_OPT, URL_OPT, _fail, app, bench_app, chaos_app
from .output import emit_report, err, usage

LAB_PACKAGES = ("sacrebleu", "jiwer", "matplotlib")  # the `lab` extra (pyproject): not in the server's install


def _need_lab() -> None:
    """The lab's commands need the `lab` extra; without it, say so in the documented form (not a traceback)."""
    import importlib.util

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ImportError:
            return True

    missing = [m for m in LAB_PACKAGES if absent(m)]
    if missing:
        _fail(NotConfigured(f"this command needs the lab extra ({', '.join(missing)} missing): "
                            "pip install 'linguafusion[lab]' (make setup installs it)"))


@bench_app.command("file")
def bench_file(
    file: Path = typer.Argument(..., help="Input file to translate repeatedly."),
    to: str = typer.Option("es", "--to"), source_lang: str | None = typer.Option(None, "--from"),
    target_modality: str = typer.Option("text", "--target-modality"),
    repeat: int = typer.Option(3, "--repeat"), json_out: Path | None = typer.Option(None, "--json"),
) -> None:
    """File latency in-process: cold (first) vs warm requests, per stage, real-time factor."""
    _need_lab()
    from ..lab.benchfile import run_file_bench

    try:
        report = run_file_bench(file, to=to, source_lang=source_lang, target_modality=target_modality,
                                repeat=repeat)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    emit_report(report, json_out)


@bench_app.command("load")
def bench_load(
    url: str | None = typer.Option(None, "--url", envvar="LINGUAFUSION_URL", help="The server to load (required)."),
    api_key: str | None = KEY_OPT,
    streams: str = typer.Option("1,2,4", "--streams", help="Comma list of concurrent stream counts."),
    mix: Path | None = typer.Option(None, "--mix", help="YAML mix of stream kinds (docs/loadgen.md)."),
    duration: float = typer.Option(30.0, "--duration", help="Seconds of audio each stream plays."),
    knee: bool = typer.Option(False, "--knee", help="Binary-search the largest load that meets the SLO."),
    baseline: bool = typer.Option(False, "--baseline", help="Also run the per-stream baseline, report the ratio."),
    run_all: bool = typer.Option(False, "--all", help="Run every N even past the first that misses (overload study)."),
    seed: int = typer.Option(0, "--seed"),
    json_out: Path | None = typer.Option(None, "--json"), html_out: Path | None = typer.Option(None, "--html"),
) -> None:
    """Drive a live server with N concurrent streams paced at real time; SLO report per class."""
    _need_lab()
    from ..lab.loadgen.mix import load_mix
    from ..lab.loadgen.sweep import run_bench_load

    if not url:
        usage("bench load needs --url (or LINGUAFUSION_URL): it measures a running server")
    try:
        counts = [int(x) for x in streams.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        usage("--streams must be a comma list of positive integers")
    try:
        report = run_bench_load(url, api_key, load_mix(mix), mix, counts, duration, seed=seed, baseline=baseline,
                                knee=knee, console=err, run_all=run_all)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    if html_out is not None:
        from ..lab.loadgen.html import write_load_html

        write_load_html(report, html_out)
    emit_report({k: v for k, v in report.items()}, json_out)


@bench_app.command("compare")
def bench_compare(a: Path = typer.Argument(...), b: Path = typer.Argument(...),
                  tolerance: float = typer.Option(0.10, "--tolerance"),
                  json_out: Path | None = typer.Option(None, "--json")) -> None:
    """Difference between two reports (bench or eval JSON); exit 1 when B regresses past the tolerance."""
    _need_lab()
    from ..lab.loadgen.sweep import compare

    try:
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    except (OSError, ValueError) as exc:
        usage(f"cannot read the reports: {exc}")
    kinds = [r.get("schema") if isinstance(r, dict) else None for r in (ra, rb)]
    if None in kinds or kinds[0] != kinds[1]:
        usage(f"{a.name} and {b.name} are not reports of one kind ({kinds[0] or 'no schema'} vs "
              f"{kinds[1] or 'no schema'}): compare a bench or eval report with another of the same kind")
    res = compare(ra, rb, tolerance)
    if not res["compared"]:
        usage(f"{a.name} and {b.name} share no metric to compare")
    for row in res["rows"]:
        if row["change"]:
            flag = "  REGRESSION" if row in res["regressions"] else ""
            sys.stdout.write(f"{row['metric']}: {row['a']:g} -> {row['b']:g} ({row['change']:+.1%}){flag}\n")
    sys.stdout.write(f"{len(res['regressions'])} regression(s) over {res['compared']} shared metrics\n")
    if json_out:
        emit_report(res, json_out)
    raise typer.Exit(1 if res["regressions"] else 0)


@chaos_app.command("run")
def chaos_run(experiment: Path = typer.Argument(..., help="Experiment YAML (see examples/chaos/)."),
              json_out: Path | None = typer.Option(None, "--json"),
              html_out: Path | None = typer.Option(None, "--html")) -> None:
    """Run a load against a server this command starts, inject the experiment's faults, compare with a baseline."""
    _need_lab()
    from ..lab.chaos.experiment import run_experiment

    try:
        report = run_experiment(experiment, err)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    if html_out is not None:
        from ..lab.loadgen.html import write_load_html

        runs = {"runs": [report["faulted"]],
                **({"baseline": {"runs": [report["baseline"]]}} if "baseline" in report else {})}
        write_load_html({**{k: v for k, v in report.items() if k not in ("baseline", "faulted")}, **runs}, html_out)
    emit_report(report, json_out)


@app.command("eval")
def eval_cmd(
    set_dir: str = typer.Option("builtin", "--set", help="Test set folder (see docs/eval.md) or 'builtin'."),
    pair: str = typer.Option("en-es", "--pair", help="source-target, e.g. en-es"),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report here."),
    html_out: Path | None = typer.Option(None, "--html", help="Write an HTML report (plots beside it)."),
    degrade: str = typer.Option("", "--degrade", help="Comma list of studies: noise,dropout,blur,offset"),
    a: float = typer.Option(0.6, "--a", help="Weight of WER in the joint score BLEU - a*WER*100."),
    seed: int = typer.Option(0, "--seed"),
    make_set: Path | None = typer.Option(None, "--make-set", help="Only write the built-in set into this folder."),
    url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
) -> None:
    """Quality (BLEU, chrF, WER/CER) and latency per path on a test set; optional degradation study."""
    _need_lab()
    from ..lab.eval.cli import run_eval

    try:
        report = run_eval(set_dir=set_dir, pair=pair, html_out=html_out, degrade=degrade, a=a, seed=seed,
                          make_set=make_set, url=url, api_key=api_key, console=err)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    emit_report(report, json_out)


