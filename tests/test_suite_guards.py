"""The suite guards itself: it tests this checkout's code (in-process and in the servers and CLI it starts), and
under CI (CI=true, as .ci/run runs) a test that would skip for want of Redis or an extra fails instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import BIN, SRC

import lingua_fusion


def test_the_suite_imports_this_checkout() -> None:
    assert Path(lingua_fusion.__file__).resolve().is_relative_to(SRC)
    out = subprocess.run([sys.executable, "-c", "import lingua_fusion; print(lingua_fusion.__file__)"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert Path(out).resolve().is_relative_to(SRC)  # servers and the CLI run from here too
    head = BIN.read_text().splitlines()[0]
    assert head.startswith("#!") and Path(head[2:].strip()).parent == Path(sys.executable).parent


def _probe(tmp_path: Path, ci: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs_extra.py").write_text('import pytest\npytest.importorskip("no_such_extra_xyz")\n\n\n'
                                                  "def test_x() -> None:\n    pass\n")
    (tmp_path / "test_needs_service.py").write_text('import pytest\n\n\n@pytest.mark.skipif(True, reason="needs '
                                                    'redis")\ndef test_y() -> None:\n    pass\n\n\n'
                                                    "def test_z() -> None:\n    pass\n")
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(SRC)])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "-W", "ignore::DeprecationWarning", "--rootdir", str(tmp_path), *extra, str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_test_that_would_skip_fails_under_ci(tmp_path: Path) -> None:
    outside = _probe(tmp_path, "")
    assert outside.returncode == 0, outside.stdout
    assert "1 passed, 2 skipped" in outside.stdout
    under = _probe(tmp_path, "true")
    assert under.returncode == 1, under.stdout
    assert "ERROR test_needs_service.py::test_y - skipped under CI" in under.stdout
    assert "skipped under CI, which must run every test: test_needs_extra.py" in under.stdout


def test_a_test_that_would_skip_fails_under_ci_on_xdist_workers_too(tmp_path: Path) -> None:
    """`make test` runs the suite on pytest-xdist workers: the skips happen there, the controller must still fail."""
    under = _probe(tmp_path, "true", "-n", "2", "--dist", "loadfile")
    assert under.returncode == 1, under.stdout
    assert "ERROR test_needs_service.py::test_y - skipped under CI" in under.stdout
    assert "skipped under CI, which must run every test: test_needs_extra.py" in under.stdout
