"""llama.cpp never runs in the serving process: the tiny LLM's pairs (en <-> de, fr, zh) go to a supervised worker
process, and a crash or a kill there costs only the work in flight. Real server, real worker, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BIN, metric, start_server, stop_server

from lingua_fusion import MultimodalTranslator

LONG = ("Please remember that the meeting on Thursday starts at nine in the morning, that every team brings its "
        "own laptop and its weekly report, and that lunch is served in the large hall on the second floor.")
COOLDOWN_S = 8
_n = iter(range(1, 1000))


def long_text() -> str:
    """A long sentence the translation memory has not seen (a cached one never reaches the worker)."""
    return LONG.replace("nine", f"nine and {next(_n)} minutes")


def llm_worker(server_pid: int) -> int | None:
    """The server's LLM worker process, if one runs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == server_pid and b"lingua_fusion.models.llm_worker" in cmd:
            return int(entry.name)
    return None


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def kill_mid_request(server_pid: int, sig: int, *, timeout_s: float = 60) -> int:
    """Wait until the LLM worker is busy (its CPU time grows), then signal it; returns its pid."""
    deadline = time.monotonic() + timeout_s
    pid = None
    while time.monotonic() < deadline:
        pid = llm_worker(server_pid)
        if pid is not None:
            try:
                before = cpu_ticks(pid)
                time.sleep(0.15)
                if cpu_ticks(pid) - before >= 3:  # working, not waiting for a request
                    os.kill(pid, sig)
                    return pid
            except (OSError, ProcessLookupError):
                pass
        time.sleep(0.02)
    raise AssertionError(f"the LLM worker never got busy (pid {pid})")


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    url, proc = start_server(tmp_path_factory.mktemp("llm-isolation"), "--no-auth",
                             env={"LINGUAFUSION_MODELS__WORKER_LOOP_CRASHES": "3",
                                  "LINGUAFUSION_MODELS__WORKER_LOOP_WINDOW_S": "300",
                                  "LINGUAFUSION_MODELS__WORKER_COOLDOWN_S": str(COOLDOWN_S)})
    try:
        yield url, proc
    finally:
        stop_server(proc)


def translate(url: str, text: str, target: str, source: str = "en", timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/translate", data={"text": text, "source_lang": source, "target_lang": target},
                      timeout=timeout)


def in_background(url: str, text: str, target: str) -> tuple[threading.Thread, dict[str, httpx.Response]]:
    """A translation request on a thread of its own; its response lands in the dict under "r"."""
    got: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: got.setdefault("r", translate(url, text, target)))
    thread.start()
    return thread, got


def test_the_cli_translates_into_german() -> None:
    p = subprocess.run([str(BIN), "translate", "--text", "Good morning, everyone.", "--from", "en", "--to", "de"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "Morgen" in p.stdout, p.stdout


def test_a_live_server_answers_the_llm_pairs_without_loading_llama(llm_server: tuple[str, Any]) -> None:
    url, proc = llm_server
    answers = {}
    for target in ("de", "fr", "zh"):
        r = translate(url, "Good morning, everyone.", target)
        assert r.status_code == 200, r.text
        answers[target] = r.json()
        assert answers[target]["text"].strip()
    assert answers["de"]["low_confidence"] and answers["zh"]["low_confidence"]  # the tiny LLM's pairs
    assert "Morgen" in answers["de"]["text"]
    es = translate(url, "The weather is good today.", "es")
    assert es.status_code == 200 and "tiempo" in es.json()["text"].lower()
    assert proc.poll() is None
    worker = llm_worker(proc.pid)
    assert worker is not None and "libllama" in maps(worker)  # the check can see llama.cpp where it is ...
    assert "libllama" not in maps(proc.pid) and "libggml" not in maps(proc.pid)  # ... and not in the server


def test_a_worker_segfault_costs_only_the_request_in_flight(llm_server: tuple[str, Any]) -> None:
    url, proc = llm_server
    translate(url, "Hello.", "de")  # the worker is up
    victim, got = in_background(url, long_text(), "de")
    killed = kill_mid_request(proc.pid, signal.SIGSEGV)
    other = translate(url, "The house is very big.", "es")  # another key's pair, while the worker is down
    victim.join(timeout=120)
    r = got["r"]
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "backend_failed" and int(r.headers["Retry-After"]) >= 1
    assert other.status_code == 200 and "casa" in other.json()["text"].lower()
    again = translate(url, "Good morning.", "de")
    assert again.status_code == 200 and again.json()["text"].strip()
    assert llm_worker(proc.pid) not in (None, killed)  # a new worker serves it
    assert proc.poll() is None
    page = httpx.get(url + "/metrics", timeout=10).text
    assert metric(page, 'linguafusion_worker_restarts_total{backend="gemma"}') >= 1
    assert metric(page, 'linguafusion_errors_total{code="backend_failed"}') >= 1


async def test_a_stream_keeps_streaming_through_a_worker_kill(llm_server: tuple[str, Any]) -> None:
    url, proc = llm_server
    t = MultimodalTranslator(base_url=url)
    events: list[dict[str, Any]] = []
    finals: asyncio.Queue[int] = asyncio.Queue()
    sentences = ["Good morning.", long_text(), "I have two brothers."]
    async with t.stream(["de"], slo="batch", partials=False) as s:
        async def send() -> None:
            for i, text in enumerate(sentences):
                killer = asyncio.create_task(asyncio.to_thread(kill_mid_request, proc.pid, signal.SIGKILL)) \
                    if i == 1 else None
                await s.send_text(text)
                await asyncio.wait_for(finals.get(), timeout=120)
                if killer is not None:
                    await killer
            await s.end()

        sender = asyncio.create_task(send())
        async for ev in s:
            events.append(ev.model_dump(exclude_none=True))
            if ev.type == "final":
                finals.put_nowait(ev.seq or 0)
        await sender
    got = [e for e in events if e["type"] == "final"]
    assert [f["seq"] for f in got] == [1, 2, 3]  # no caption lost, none twice
    assert got[0]["text"].strip() and got[2]["text"].strip() and "failed" not in got[2]
    # the killed one was retried on the new worker, or says it failed
    assert got[1]["text"].strip() or got[1].get("failed") == ["mt:de"], got[1]
    assert proc.poll() is None


def test_a_crash_loop_marks_the_route_unavailable_and_says_why(llm_server: tuple[str, Any]) -> None:
    url, proc = llm_server
    for _ in range(6):
        if httpx.get(url + "/readyz", timeout=10).json().get("unavailable"):
            break
        victim, got = in_background(url, long_text(), "de")
        kill_mid_request(proc.pid, signal.SIGSEGV)
        victim.join(timeout=120)
        assert got["r"].status_code == 503
    ready = httpx.get(url + "/readyz", timeout=10)
    assert ready.status_code == 200  # the other routes still serve: not a 503 for the whole server
    assert "SIGSEGV" in ready.json()["unavailable"]["gemma"]
    assert ready.json()["workers"]["gemma"]["state"] == "unavailable"
    models = httpx.get(url + "/v1/models", timeout=10).json()
    en_de = next(r for r in models["routes"] if r["pair"] == "en-de")
    assert en_de["available"] is False and "crashed" in en_de["unavailable_reason"]
    assert next(r for r in models["routes"] if r["pair"] == "en-es")["available"] is True
    assert next(m for m in models["models"] if m["name"].startswith("gemma"))["available"] is False
    cli = subprocess.run([str(BIN), "models", "--url", url], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "unavailable" in cli.stdout and "SIGSEGV" in cli.stdout, cli.stdout
    started = time.monotonic()
    refused = translate(url, f"Good morning, team {next(_n)}.", "de")  # (not in the translation memory)
    assert time.monotonic() - started < 5  # at once: nothing is started to crash again
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "backend_unavailable"
    assert "crashed" in refused.json()["error"]["message"] and int(refused.headers["Retry-After"]) >= 1
    assert llm_worker(proc.pid) is None
    assert translate(url, "The dog is black.", "es").status_code == 200
    time.sleep(COOLDOWN_S + 0.5)
    back = translate(url, f"Good morning, team {next(_n)}.", "de")
    assert back.status_code == 200 and back.json()["text"].strip()
    assert httpx.get(url + "/readyz", timeout=10).json().get("unavailable") is None
    assert proc.poll() is None
