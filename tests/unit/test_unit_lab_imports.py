"""The import graph read from the source by scripts/import_graph.py: no import cycle (function-level imports
count), the proof tools (lingua_fusion.lab) stay apart (only cli/lab.py and cli/stream.py import them, inside
functions), and stream/, files/ and rooms/ use serving/ through its declared face only (ports, keys, Engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_cycle_no_lab_in_the_product_and_serving_only_through_its_face() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK: no import cycle" in p.stdout


def test_the_graph_check_fails_on_a_cycle_and_on_an_import_past_the_face(tmp_path: Path) -> None:
    pkg = tmp_path / "lingua_fusion"
    for folder, body in {"stream": "from ..serving.scheduler import X\n", "serving": "",
                         "files": "def f():\n    from ..files import b\n"}.items():
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "a.py").write_text(body)
    (pkg / "__init__.py").write_text("")
    (pkg / "serving" / "scheduler.py").write_text("X = 1\n")
    (pkg / "files" / "b.py").write_text("from . import a\n")  # a -> b (lazy) -> a
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py"), "--src", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout
    assert "lingua_fusion.files.a, lingua_fusion.files.b" in p.stdout
    assert "lingua_fusion.stream.a (line 1) -> lingua_fusion.serving.scheduler" in p.stdout


def test_the_shared_fixtures_are_where_both_tools_find_them() -> None:
    from lingua_fusion.lab import fixtures
    from lingua_fusion.lab.eval import testset
    from lingua_fusion.lab.loadgen import mix

    rows = fixtures.builtin_sentences()
    assert len(rows) >= 10 and all(len(r) == 3 and r[1] and r[2] for r in rows)
    assert mix.builtin_sentences is testset.builtin_sentences is fixtures.builtin_sentences
    assert testset.slide_png is fixtures.slide_png
    assert fixtures.slide_png("Hello.").startswith(b"\x89PNG")
