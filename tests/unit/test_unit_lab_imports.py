"""The proof tools (lingua_fusion.lab) stay apart: no import cycle through them, and the product does not
import them (only cli/lab.py and cli/stream.py, inside functions). Read from the source by
scripts/import_graph.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_cycle_through_lab_and_the_product_does_not_import_it() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK: no cycle involves lab/" in p.stdout


def test_the_shared_fixtures_are_where_both_tools_find_them() -> None:
    from lingua_fusion.lab import fixtures
    from lingua_fusion.lab.eval import testset
    from lingua_fusion.lab.loadgen import mix

    rows = fixtures.builtin_sentences()
    assert len(rows) >= 10 and all(len(r) == 3 and r[1] and r[2] for r in rows)
    assert mix.builtin_sentences is testset.builtin_sentences is fixtures.builtin_sentences
    assert testset.slide_png is fixtures.slide_png
    assert fixtures.slide_png("Hello.").startswith(b"\x89PNG")
