"""The ``linguafusion`` command run as a subprocess, as a user would."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import BIN, Server, piper_wav, render_slide, silence_wav


def run(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli-media")
    (d / "talk.wav").write_bytes(piper_wav("The house is very big. We need more time."))
    (d / "slide.png").write_bytes(render_slide(["The house is very big"]))
    (d / "notes.txt").write_text("The house is very big.", encoding="utf-8")
    (d / "broken.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage")
    short = silence_wav(0.6)
    (d / "cut.wav").write_bytes(short[: 44 + (len(short) - 44) // 3])  # its header promises three times as much
    return d


def test_translate_json_in_process(media: Path) -> None:
    p = run("translate", str(media / "talk.wav"), "--to", "es", "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert {"text", "source_text", "source_lang", "target_lang", "segments", "latency_ms"} <= set(obj)
    assert "casa" in obj["text"].lower() and obj["source_lang"] == "en" and obj["target_lang"] == "es"


def test_translate_through_server(server: Server, media: Path) -> None:
    p = run("translate", str(media / "slide.png"), "--to", "es", "--json", "--url", server.url,
            "--api-key", server.key())
    assert p.returncode == 0, p.stderr
    assert "casa" in json.loads(p.stdout)["text"].lower()
    p = run("translate", str(media / "notes.txt"), "--to", "es", env={"LINGUAFUSION_URL": server.url,
                                                                      "LINGUAFUSION_API_KEY": server.key()})
    assert p.returncode == 0 and "casa" in p.stdout.lower()


def test_bad_input_exits_non_zero_with_a_clear_message(media: Path, server: Server) -> None:
    p = run("translate", str(media / "broken.wav"), "--to", "es", "--json")
    assert p.returncode == 2 and p.stdout == "" and "corrupt_media" in p.stderr
    p = run("translate", str(media / "notes.txt"), "--to", "xx", "--json", "--url", server.url,
            "--api-key", server.key())
    assert p.returncode == 2 and "unknown_language" in p.stderr
    p = run("translate", str(media / "notes.txt"), "--to", "es", "--url", server.url, "--api-key", "sk_nope")
    assert p.returncode == 2 and "unauthenticated" in p.stderr


def test_a_truncated_wav_is_told_as_truncated_not_as_silence(media: Path) -> None:
    p = run("translate", str(media / "cut.wav"), "--to", "es")
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert "error [corrupt_media]: the audio file is truncated: its header says 0.60 s" in p.stderr, p.stderr


def test_captions_speech_and_glossary(media: Path, tmp_path: Path) -> None:
    p = run("translate", str(media / "talk.wav"), "--to", "es", "--format", "srt")
    assert p.returncode == 0 and p.stdout.startswith("1\n00:00:00,")
    out = tmp_path / "out.wav"
    p = run("translate", "--text", "Good morning.", "--from", "en", "--to", "en", "--target-modality", "speech",
            "-o", str(out))
    assert p.returncode == 0 and out.read_bytes()[:4] == b"RIFF"
    g = tmp_path / "terms.csv"
    g.write_text("source,target\nhouse,vivienda\n", encoding="utf-8")
    p = run("translate", str(media / "notes.txt"), "--to", "es", "--glossary", str(g), "--json")
    assert p.returncode == 0 and "vivienda" in json.loads(p.stdout)["text"].lower()


def test_models_and_keys(tmp_path: Path) -> None:
    p = run("models", "--json")
    caps = json.loads(p.stdout)
    assert {m["task"] for m in caps["models"]} >= {"asr", "mt", "ocr", "tts", "braille", "vad"}
    assert all(m["licence"] for m in caps["models"])
    assert "en-es" in caps["pairs"] and "ja-en" not in caps["pairs"]
    table = run("models")
    assert table.returncode == 0 and "apertium" in table.stdout
    state = str(tmp_path / "state")
    secret = run("keys", "create", "--name", "ci", "--state-dir", state).stdout.strip()
    assert secret.startswith("sk_")
    listing = run("keys", "list", "--state-dir", state).stdout
    key_id = listing.split("\t")[0]
    assert key_id.startswith("key_") and "active" in listing and secret not in listing
    assert run("keys", "revoke", key_id, "--state-dir", state).returncode == 0
    assert "revoked" in run("keys", "list", "--state-dir", state).stdout
    assert secret.encode() not in (tmp_path / "state" / "linguafusion.sqlite3").read_bytes()


def test_no_auth_refuses_non_loopback() -> None:
    p = run("serve", "--host", "0.0.0.0", "--port", "1", "--no-auth", timeout=60)
    assert p.returncode == 2 and "loopback" in p.stderr


@pytest.mark.parametrize(("args", "said"), [
    (("serve", "--workers", "0"), "--workers"),  # a value out of range
    (("serve", "--workers", "2", "--model-processes", "3"), "--model-processes 3"),  # one model process per worker
    (("translate", "--bogus"), "--bogus"),  # an unknown option
    (("translate", "notes.txt"), "--to"),  # a missing one
    (("frobnicate",), "frobnicate"),  # an unknown command
])
def test_usage_errors_are_told_in_the_documented_form(args: tuple[str, ...], said: str) -> None:
    """A command line the CLI cannot run: `error [invalid_parameter]: ...` on stderr and exit 2, no traceback, no
    box."""
    p = run(*args, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("error [invalid_parameter]: ") and said in p.stderr and "Traceback" not in p.stderr
