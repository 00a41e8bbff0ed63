"""The proof tools against real servers and real models: bench load, eval, compare (as a user runs them)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BIN, piper_wav, render_slide, start_server, stop_server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, proc = start_server(tmp_path_factory.mktemp("load"), "--no-auth")
    yield url
    stop_server(proc)


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout)


def _counter(url: str, name: str) -> float:
    """A counter summed over its labels, read straight from /metrics."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] == name:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_bench_load_report_matches_server_metrics(live: str, tmp_path: Path) -> None:
    before = _counter(live, "linguafusion_caption_latency_seconds_count")
    out = tmp_path / "load.json"
    p = run("bench", "load", "--url", live, "--streams", "1,2", "--duration", "6", "--json", str(out),
            "--html", str(tmp_path / "load.html"))
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["schema"] == "linguafusion.bench.load/1" and rep["commit"] and rep["machine"]["cpus"]
    assert [r["streams"] for r in rep["runs"]] == [1, 2]
    std = rep["runs"][1]["classes"]["standard"]
    assert std["streams"] == 2 and std["admitted"] == 2 and std["rejected"] == 0
    assert std["caption_latency_s"]["p99"] is not None and std["caption_latency_s"]["p50"] > 0
    assert std["goodput_streams"] <= std["admitted"]
    # what the client counted is what the server counted
    client = sum(r["client_captions"] for r in rep["runs"])
    assert client == sum(r["server"]["captions"] for r in rep["runs"]) > 0
    after = _counter(live, "linguafusion_caption_latency_seconds_count")
    assert after - before == client
    assert rep["runs"][0]["server"]["rss_mib"] > 50
    assert (tmp_path / "load-goodput.png").stat().st_size > 1000 and "<img" in (tmp_path / "load.html").read_text()


def test_bench_load_counts_rejections(tmp_path: Path) -> None:
    import os

    url, proc = start_server(tmp_path, "--no-auth", env={**os.environ, "LINGUAFUSION_SERVER__MAX_STREAMS": "1"})
    try:
        out = tmp_path / "load.json"
        p = run("bench", "load", "--url", url, "--streams", "3", "--duration", "4", "--json", str(out))
        assert p.returncode == 0, p.stderr
        rep = json.loads(out.read_text())
        std = rep["runs"][0]["classes"]["standard"]
        assert std["rejected"] == rep["runs"][0]["server"]["rejected"] >= 1
        assert std["rejected_codes"] == ["overloaded"] and rep["runs"][0]["meets_slo"] is False
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("set")
    rows = [("a1", "The house is very big.", "La casa es muy grande."),
            ("a2", "We need more time to finish the project.", "Necesitamos más tiempo para terminar el proyecto.")]
    for sub in ("speech", "slides", "text"):
        (d / sub).mkdir()
    for i, en, es in rows:
        (d / "speech" / f"{i}.wav").write_bytes(piper_wav(en))
        (d / "slides" / f"{i}.png").write_bytes(render_slide([en]))
        for sub in ("speech", "slides", "text"):
            (d / sub / f"{i}.src.txt").write_text(en)
            (d / sub / f"{i}.es.txt").write_text(es)
    return d


@pytest.fixture(scope="module")
def eval_runs(small_set: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """`eval` on the folder with a blur study, run twice with the same seed: the first report is the folder's
    eval (its paths are what `eval` without --degrade reports), the two together show the study is reproducible.
    One scenario shared by the two tests below, which used to run eval three times between them."""
    d = tmp_path_factory.mktemp("eval")
    reports = []
    for k in range(2):
        out = d / f"deg{k}.json"
        p = run("eval", "--set", str(small_set), "--pair", "en-es", "--degrade", "blur", "--json", str(out),
                "--html", str(d / f"deg{k}.html"))
        assert p.returncode == 0, p.stderr
        reports.append(json.loads(out.read_text()))
    return d, reports


def test_eval_on_a_folder_and_compare(eval_runs: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    d, reports = eval_runs
    out = d / "deg0.json"
    rep = reports[0]
    assert rep["schema"] == "linguafusion.eval/1" and rep["pair"] == "en-es" and rep["errors"] == []
    assert set(rep["paths"]) == {"speech", "slides", "text"}
    for path in rep["paths"].values():
        assert path["items"] == 2 and path["bleu"]["score"] > 10 and path["chrf"]["score"] > 40
        assert "version:" in path["bleu"]["signature"]
    assert rep["paths"]["speech"]["wer"] <= 0.2 and rep["paths"]["slides"]["cer"] <= 0.05
    # compare: the same report is no regression; a worse copy is flagged and exits 1
    same = run("bench", "compare", str(out), str(out))
    assert same.returncode == 0 and "0 regression" in same.stdout
    worse = json.loads(out.read_text())
    worse["paths"]["text"]["bleu"]["score"] /= 2
    (tmp_path / "worse.json").write_text(json.dumps(worse))
    flagged = run("bench", "compare", str(out), str(tmp_path / "worse.json"))
    assert flagged.returncode == 1 and "REGRESSION" in flagged.stdout and "paths.text.bleu.score" in flagged.stdout


def test_eval_degradation_study_is_reproducible(eval_runs: tuple[Path, list[dict[str, Any]]]) -> None:
    d, reports = eval_runs
    outs = [r["studies"][0] for r in reports]
    study = outs[0]
    assert study["study"] == "blur" and study["path"] == "slides"
    assert [r["level"] for r in study["rows"]] == [0.0, 1.0, 2.0, 3.0, 4.0, 6.0]
    assert study["rows"][0]["bleu"] >= study["rows"][-1]["bleu"]  # quality does not improve with heavy blur
    assert 0.0 <= study["knee"]["confidence"] <= 1.0
    assert outs[0]["rows"] == outs[1]["rows"]  # deterministic under the same seed
    assert (d / "deg0-blur.png").exists()


def test_eval_bad_set_is_a_clear_error(tmp_path: Path) -> None:
    p = run("eval", "--set", str(tmp_path), "--pair", "en-es")
    assert p.returncode == 2 and "invalid_parameter" in p.stderr
