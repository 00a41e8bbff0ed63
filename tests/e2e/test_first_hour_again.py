"""Issue 27, "a user's first hour, second round": what misled a new user, run the way they ran it (the CLI as a
subprocess, the SDK over HTTP and in-process), asserting what they see."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BIN, encode_audio, piper_wav, render_slide, start_server, stop_server

from lingua_fusion.sdk import LocalTranslator, MultimodalTranslator

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def lying_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files whose names lie about what they hold, and a .webm that holds only audio."""
    d = tmp_path_factory.mktemp("lying")
    wav = piper_wav("The house is very big.")
    files = {"wav_named_png": d / "speech.png", "png_named_wav": d / "slide.wav", "audio_webm": d / "talk.webm"}
    files["wav_named_png"].write_bytes(wav)
    files["png_named_wav"].write_bytes(render_slide(["The weather is good today"]))
    files["audio_webm"].write_bytes(encode_audio(wav, "webm", "libopus"))
    return files


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    u, proc = start_server(tmp_path_factory.mktemp("first-hour-again"), "--no-auth")
    yield u
    stop_server(proc)


def test_the_cli_tells_the_type_by_the_bytes_not_the_name(lying_files: dict[str, Path]) -> None:
    speech = cli("translate", lying_files["wav_named_png"], "--to", "es", "--from", "en")
    assert speech.returncode == 0, speech.stderr
    assert "casa" in speech.stdout.lower() and "declared" not in speech.stderr
    slide = cli("translate", lying_files["png_named_wav"], "--to", "es", "--from", "en")
    assert slide.returncode == 0, slide.stderr
    assert "tiempo" in slide.stdout.lower()
    webm = cli("translate", lying_files["audio_webm"], "--to", "es", "--from", "en", "--json")
    assert webm.returncode == 0, webm.stderr
    assert '"source_modality": "audio"' in webm.stdout and "casa" in webm.stdout.lower()


def test_the_sdk_tells_the_type_by_the_bytes_over_http_and_in_process(lying_files: dict[str, Path],
                                                                       url: str) -> None:
    for client in (MultimodalTranslator(base_url=url), LocalTranslator()):
        r = client.translate(str(lying_files["wav_named_png"]), target_lang="es", source_lang="en")
        assert r.source_modality == "audio" and "casa" in r.text.lower()
        r = client.translate(str(lying_files["png_named_wav"]), target_lang="es", source_lang="en")
        assert r.source_modality == "image" and "tiempo" in r.text.lower()
    # what the user declares still counts: a WAV declared an image is refused, naming what it is
    bad = cli("translate", lying_files["wav_named_png"], "--to", "es", "--modality", "image")
    assert bad.returncode == 2 and "error [media_type_mismatch]" in bad.stderr


def test_listen_help_says_it_needs_a_server() -> None:
    p = cli("listen", "--help")
    assert p.returncode == 0 and "run in-process" not in p.stdout and "required" in p.stdout


def test_stream_checks_the_key_before_it_listens_to_the_file(tmp_path: Path) -> None:
    from conftest import talk_wav

    url, proc = start_server(tmp_path)  # auth on
    try:
        talk = tmp_path / "talk.wav"
        talk.write_bytes(talk_wav(["Good morning everyone.", "The house is very big."]))
        p = cli("stream", talk, "--to", "es", "--url", url, "--api-key", "sk_wrong", timeout=120)
        assert p.returncode == 2 and "error [unauthenticated]" in p.stderr, p.stderr
        assert "detect" not in p.stderr.lower()  # refused before Whisper's language detection ran
    finally:
        stop_server(proc)


async def test_a_live_room_counts_its_finals_while_it_is_live(url: str) -> None:
    import httpx

    translator = MultimodalTranslator(base_url=url)
    async with translator.stream(["es"], partials=False, inputs=["text"], room=True) as s:
        room_id = s.ready["room_id"]
        events = s.__aiter__()
        for i, text in enumerate(["Good morning.", "The river is long.", "The sky is blue."]):
            await s.send_text(text, ts=float(i))
        seen = 0
        while seen < 3:
            if (await events.__anext__()).type == "final":
                seen += 1
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            live = (await http.get(f"/v1/rooms/{room_id}")).json()
        assert live["state"] == "live" and live["finals"] == 3, live
        await s.end()


def test_the_banner_prints_a_keys_command_that_runs_in_the_users_shell(tmp_path: Path) -> None:
    import os
    import shutil

    env = {"PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                   if Path(p).resolve() != BIN.parent.resolve())}
    url, proc = start_server(tmp_path, env=env)  # auth on, no key yet, .venv/bin not on PATH
    try:
        log = next(tmp_path.glob("server-*.log")).read_text()
    finally:
        stop_server(proc)
    assert shutil.which("linguafusion", path=env["PATH"]) is None
    assert f"{BIN} keys create --admin --state-dir {tmp_path}" in log, log


UNKNOWN = "We must halve emissions near the gazebo."  # words Apertium's dictionaries do not know


def test_words_left_untranslated_are_named_in_the_result_and_on_the_cli() -> None:
    r = LocalTranslator().translate(text=UNKNOWN, source_lang="en", target_lang="fr")
    assert "*" not in r.text and "halve" in r.text  # left as written through both legs of the pivot ...
    assert any("untranslated" in w and "halve, gazebo" in w for w in r.warnings)  # ... and said
    p = cli("translate", "--text", UNKNOWN, "--from", "en", "--to", "fr")
    assert p.returncode == 0 and "*" not in p.stdout and "untranslated" in p.stderr and "halve" in p.stderr


async def test_a_stream_final_names_its_untranslated_words(url: str) -> None:
    translator = MultimodalTranslator(base_url=url)
    async with translator.stream(["fr", "pt"], partials=False, inputs=["text"]) as s:
        await s.send_text(UNKNOWN, ts=0.0)
        async for ev in s:
            if ev.type == "final":
                final = ev.model_dump()
                break
        await s.end()
    assert "*" not in final["translations"]["fr"] and final["untranslated"]["fr"] == ["halve", "gazebo"]
    assert "pt" not in final["untranslated"] and "untranslated" in final["note"]  # (no marks from Bergamot)


def test_chinese_comes_in_the_script_its_tag_asks_for() -> None:
    from lingua_fusion.models.transcript_guard import to_script

    local = LocalTranslator()
    simplified = local.translate(text="The museum is closed on Mondays.", source_lang="en", target_lang="zh").text
    traditional = local.translate(text="The museum is closed on Mondays.", source_lang="en",
                                  target_lang="zh-TW").text
    assert to_script(simplified, "Hans") == simplified and to_script(traditional, "Hant") == traditional
    assert traditional == to_script(simplified, "Hant") and traditional != simplified  # 博物馆 / 博物館
