"""The ``linguafusion`` command with a client's mistakes it used to answer with a Python traceback (exit 1):
each must print ``error [code]: message`` on stderr and exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import BIN


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=120)


def _refused(p: subprocess.CompletedProcess[str], code: str) -> None:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert f"error [{code}]:" in p.stderr


def test_keys_with_a_state_dir_that_is_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    _refused(run("keys", "create", "--state-dir", str(a_file)), "invalid_parameter")


@pytest.mark.parametrize("command", ["create", "list"])
def test_keys_with_a_corrupt_key_store(tmp_path: Path, command: str) -> None:
    (tmp_path / "linguafusion.sqlite3").write_text("not a database at all")
    p = run("keys", command, "--state-dir", str(tmp_path))
    _refused(p, "invalid_parameter")
    assert "not a database" in p.stderr


@pytest.mark.parametrize("args", [["--url", "http://[::1", "--api-key", "sk_x"],
                                  ["--url", "::::", "--api-key", "sk_x"],
                                  ["--url", "http://127.0.0.1:9", "--api-key", "sk_é"]])
def test_translate_with_a_malformed_url_or_key(args: list[str]) -> None:
    _refused(run("translate", "--text", "Good morning", "--from", "en", "--to", "es", *args), "invalid_parameter")


def test_bench_load_against_no_server_is_refused_not_reported_as_zero_goodput(tmp_path: Path) -> None:
    """It printed a report with goodput 0/1 and exited 0: a proof of nothing that looked like a measurement."""
    from conftest import free_port

    out = tmp_path / "load.json"
    p = run("bench", "load", "--url", f"http://127.0.0.1:{free_port()}", "--streams", "1", "--duration", "2",
            "--json", str(out))
    _refused(p, "backend_unavailable")
    assert "--url" in p.stderr and not out.exists()


BLOCK_LAB = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sacrebleu", "jiwer", "matplotlib"):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Block())
from lingua_fusion.cli import main
sys.argv = ["linguafusion", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("args", [["bench", "compare", "a.json", "b.json"], ["eval", "--pair", "en-es"],
                                  ["chaos", "run", "x.yaml"]])
def test_the_lab_commands_without_the_lab_extra_say_what_to_install(args: list[str]) -> None:
    """sacrebleu, jiwer and matplotlib are the `lab` extra, out of the server's install (issue 28): a lab command
    without them says so, in the documented form."""
    import sys

    p = subprocess.run([sys.executable, "-c", BLOCK_LAB, *args], capture_output=True, text=True, timeout=120)
    _refused(p, "not_configured")
    assert "pip install 'linguafusion[lab]'" in p.stderr and "sacrebleu" in p.stderr
