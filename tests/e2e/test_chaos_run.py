"""`linguafusion chaos run` end to end: a managed server, faults on a schedule, the report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import BIN


def test_chaos_run_kill_delay_and_noise(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("""
name: ci-chaos
server: {args: ["--no-auth"]}
baseline: false
load: {streams: 2, duration: 16}
faults:
  - {at: 2, kind: model_delay, model: mt, delay_s: 0.5}
  - {at: 5, kind: clear_faults}
  - {at: 7, kind: kill_server}
  - {kind: audio_noise, level: 25}
""")
    out = tmp_path / "chaos.json"
    p = subprocess.run([str(BIN), "chaos", "run", str(exp), "--json", str(out), "--html", str(tmp_path / "c.html")],
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["schema"] == "linguafusion.chaos/1" and rep["name"] == "ci-chaos"
    log = {f["kind"]: f for f in rep["faulted"]["faults"]}
    assert log["model_delay"]["status"] == 201 and log["clear_faults"]["status"] == 200
    assert log["kill_server"]["restart_s"] > 0
    s = rep["summary"]
    assert s["lost"] == 0 and s["duplicated"] == 0 and s["reconnects"] >= 2  # both streams resumed
    assert s["captions_faulted"] >= 4
    assert (tmp_path / "c.html").exists()


def test_bad_experiment_is_a_clear_error(tmp_path: Path) -> None:
    exp = tmp_path / "bad.yaml"
    exp.write_text("load: {streams: 1, duration: 5}\nfaults: [{kind: meteor}]\n")
    p = subprocess.run([str(BIN), "chaos", "run", str(exp)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "meteor" in p.stderr


def test_camera_faults_drop_blur_and_shift_slide_frames() -> None:
    import io

    import numpy as np
    from PIL import Image

    from lingua_fusion.lab.chaos.experiment import _image_fault
    from lingua_fusion.lab.fixtures import slide_png

    png = slide_png("The new office will open in the spring.")
    drop = _image_fault([{"kind": "frame_drops", "level": 0.2}], seed=3)
    kept = [drop(png, i) for i in range(2000)]
    assert 0.15 < sum(k is None for k in kept) / 2000 < 0.25  # each frame dropped with probability 0.2
    assert all(k == png for k in kept if k is not None)  # the others untouched
    assert [drop(png, i) is None for i in range(50)] == [k is None for k in kept[:50]]  # seeded: reproducible
    shift = _image_fault([{"kind": "slide_blur", "level": 2}, {"kind": "slide_offset", "level": 300}], seed=0)
    out = np.asarray(Image.open(io.BytesIO(shift(png, 0))).convert("L"))
    clean = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    dark = lambda a: np.nonzero((a < 128).any(axis=0))[0]  # noqa: E731 - columns holding text
    assert dark(out).max() <= dark(clean).max() - 250  # text moved left by about 300 px (its start is cut off)
    blurred = np.asarray(Image.open(io.BytesIO(_image_fault([{"kind": "slide_blur", "level": 2}], seed=0)(png, 0)))
                         .convert("L"))
    edges = lambda a: np.abs(np.diff(a.astype(int), axis=1)).sum()  # noqa: E731
    assert edges(blurred) < 0.8 * edges(clean)  # softer edges, same text
