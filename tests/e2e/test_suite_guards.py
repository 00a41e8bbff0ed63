"""The suite guards itself: it tests this checkout's code (in-process and in the servers and CLI it starts), and
under CI (CI=true, as .ci/run runs) a test that would skip for want of Redis or an extra fails instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
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
    tests = Path(__file__).resolve().parents[1]  # conftest.py's folder
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(tests), str(SRC)])}
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


def test_a_segfault_and_a_hang_each_fail_their_test_and_the_run_ends(tmp_path: Path) -> None:
    """A native crash kills its xdist worker and a sleep outlives its timeout: both are reported, and the run
    finishes (before this guard it waited for ever after replacing the crashed worker)."""
    (tmp_path / "test_crash.py").write_text("import ctypes\n\n\ndef test_segfault() -> None:\n"
                                            "    ctypes.string_at(0)\n")
    (tmp_path / "test_hang.py").write_text("import time\n\n\ndef test_sleeps() -> None:\n    time.sleep(600)\n")
    for name in "abcdef":
        (tmp_path / f"test_fine_{name}.py").write_text("def test_fine() -> None:\n    pass\n")
    (tmp_path / "test_crash_then_more.py").write_text("import ctypes\n\n\ndef test_before() -> None:\n    pass\n\n\n"
                                                      "def test_crash() -> None:\n    ctypes.string_at(0)\n\n\n"
                                                      "def test_after() -> None:\n    pass\n")
    run = _probe(tmp_path, "", "-n", "2", "--dist", "loadfile", "-o", "timeout=5")
    assert run.returncode == 1, run.stdout
    assert "FAILED test_crash.py::test_segfault - worker 'gw" in run.stdout
    assert "FAILED test_crash_then_more.py::test_crash - worker 'gw" in run.stdout
    assert "FAILED test_hang.py::test_sleeps - Failed: Timeout" in run.stdout
    # everything else ran once: 6 fine files, test_before and test_after, and the probe's own test_z
    assert "3 failed, 9 passed, 2 skipped" in run.stdout, run.stdout


class _Worker:
    """The parts of xdist's WorkerController its scheduler touches."""

    def __init__(self, name: str) -> None:
        self.gateway, self.shutting_down, self.sent = SimpleNamespace(id=name), False, list[list[int]]()

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_two_replacement_workers_collecting_at_different_times_each_get_work() -> None:
    """CI saw it: two workers crashed, one replacement finished collecting while the other had not, and xdist gave
    work to the one with no collection (KeyError, INTERNALERROR, exit 3)."""
    from xdist.scheduler.loadfile import LoadFileScheduling
    from xdist.scheduler.loadscope import LoadScopeScheduling
    from xdist_guard import remove_node, waits_for_collection

    original = getattr(LoadScopeScheduling._reschedule, "unguarded", LoadScopeScheduling._reschedule)
    plain = type("Plain", (LoadFileScheduling,), {"remove_node": remove_node, "_reschedule": original})
    guarded = type("Guarded", (LoadFileScheduling,), {"remove_node": remove_node,
                                                       "_reschedule": waits_for_collection(original)})
    with pytest.raises(KeyError):
        _two_crash_and_are_replaced(plain)
    _two_crash_and_are_replaced(guarded)


def _two_crash_and_are_replaced(scheduler: type) -> None:
    tests = [f"test_{name}.py::test_{i}" for name in "abcdefgh" for i in range(3)]
    sched = scheduler(SimpleNamespace(getvalue=lambda name: ["2*popen"], option=SimpleNamespace(loadscopereorder=True)))
    first, second = _Worker("gw0"), _Worker("gw1")
    for node in (first, second):
        sched.add_node(node)
        sched.add_node_collection(node, tests)
    sched.schedule()
    assert first.sent and second.sent
    assert sched.remove_node(first) == tests[0] and sched.remove_node(second) == tests[3]  # both crash at once
    third, fourth = _Worker("gw2"), _Worker("gw3")
    sched.add_node(third)
    sched.add_node(fourth)
    sched.add_node_collection(third, tests)
    sched.schedule()  # gw3 has not collected yet: before the guard, KeyError here
    assert third.sent and not fourth.sent
    sched.add_node_collection(fourth, tests)
    sched.schedule()
    assert fourth.sent
    sent = [tests[i] for node in (first, second, third, fourth) for batch in node.sent for i in batch]
    assert sent.count(tests[0]) == 1 and sent.count(tests[3]) == 1  # a crashed test is not run again
    queued = [test for unit in sched.workqueue.values() for test in unit]
    later = sent[len(first.sent[0]) + len(second.sent[0]):] + queued
    assert tests[1] in later and tests[4] in later  # what the crashes left undone is sent again or still queued


def test_the_ci_watchdog_prints_what_is_stuck_and_fails(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "watchdog.sh"
    stuck = [sys.executable, "-c", "import time\ndef waiting_for_ever():\n    time.sleep(600)\nwaiting_for_ever()"]
    run = subprocess.run(["bash", str(script), "3", *stuck], capture_output=True, text=True, timeout=90)
    assert run.returncode == 124, run.stderr
    assert "[watchdog] still running after 3 s" in run.stderr
    assert "waiting_for_ever" in run.stderr  # the stuck process's stack
    fine = subprocess.run(["bash", str(script), "30", sys.executable, "-c", "raise SystemExit(3)"],
                          capture_output=True, text=True, timeout=60)
    assert fine.returncode == 3 and "watchdog" not in fine.stderr


@pytest.mark.timeout(300)
def test_two_collections_of_the_suite_are_the_same() -> None:
    """pytest-xdist refuses a run whose workers collect different tests (CI saw it: a test parametrized by a token
    made with secrets at import time). Two collections of the whole suite must give the same ids."""
    tests = Path(__file__).resolve().parents[1]

    def collect() -> list[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                              str(tests)], capture_output=True, text=True, timeout=240, cwd=tests.parent)
        ids = [line for line in out.stdout.splitlines() if "::" in line]
        assert ids, out.stdout[-2000:] + out.stderr[-2000:]
        return ids

    first, second = collect(), collect()
    assert first == second, sorted(set(first) ^ set(second))[:10]
