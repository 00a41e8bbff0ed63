"""Caption latency through the web page (headless Chromium) vs the CLI, on one server, alternating runs.

The same Piper WAV is played as a live stream, ``--runs`` times each, alternating: by the page at ``/`` (media
element -> AudioWorklet -> 100 ms PCM16 audio messages, ticket, WebSocket) and by ``linguafusion stream --realtime``
(250 ms chunks paced by the clock: the baseline, the same server and engine).

Latency of a final:
- page: when the browser received the final minus when it sent the audio message that holds the audio at the
  final's ``end`` (DevTools network log timestamps, one clock);
- CLI: its own ``latency_s``: received minus the moment the audio at ``end`` was due (t0 + end).
The server-side figure (audio end received -> caption sent, ``latency_ms.caption`` in the final) is reported for
both. Figures: median and max per path and the ratio page / CLI of the medians. JSON in bench/results/web_latency.json.

    .venv/bin/python bench/web_latency.py --runs 3
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
BIN = Path(sys.executable).parent / "linguafusion"
SENTENCES = ["Good morning everyone.", "Today we talk about the weather in the city and the river bank, which is "
             "green in the spring and brown in the autumn.", "Thank you for listening."]


def speech_wav(path: Path) -> None:
    from lingua_fusion.models.tts import PiperTTS, to_wav

    tts = PiperTTS()
    parts = []
    rate = 22050
    for s in SENTENCES:
        pcm, rate = tts.synthesize(s, language="en")
        parts += [np.asarray(pcm, dtype=np.int16), np.zeros(int(0.8 * rate), dtype=np.int16)]
    path.write_bytes(to_wav(np.concatenate(parts), rate))


def serve(state: Path, port: int) -> tuple[subprocess.Popen[bytes], str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         check=True, env=env).stdout.strip()
    proc = subprocess.Popen([str(BIN), "serve", "--port", str(port), "--state-dir", str(state), "--log-level",
                             "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url, key
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server not ready")


def page_run(url: str, key: str, wav: Path) -> list[dict[str, float]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--autoplay-policy=no-user-gesture-"
                "required"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url + "/")
        driver.execute_script("sessionStorage.setItem('linguafusion.key', arguments[0])", key)
        driver.get(url + "/")
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#targets input:checked"))
        Select(driver.find_element(By.ID, "slo")).select_by_value("standard")
        driver.find_element(By.ID, "file-input").send_keys(str(wav))
        driver.get_log("performance")
        driver.find_element(By.ID, "start").click()
        WebDriverWait(driver, 120, 0.2).until(
            lambda d: d.find_element(By.ID, "status").get_attribute("data-state") in ("closed", "error"))
        events = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    finally:
        driver.quit()
    sent: list[tuple[float, float]] = []  # (time, media time at the end of this audio message)
    out = []
    for e in events:
        if e["method"] == "Network.webSocketFrameSent" and e["params"]["response"]["opcode"] == 1:
            msg = json.loads(e["params"]["response"]["payloadData"])
            if msg.get("type") == "audio":
                sent.append((e["params"]["timestamp"], msg["ts"] + len(base64.b64decode(msg["data"])) / 32000))
        elif e["method"] == "Network.webSocketFrameReceived" and e["params"]["response"]["opcode"] == 1:
            ev = json.loads(e["params"]["response"]["payloadData"])
            if ev.get("type") == "final":
                when = next((t for t, media in sent if media >= ev["end"]), sent[-1][0])
                out.append({"latency_s": e["params"]["timestamp"] - when,
                            "server_caption_s": ev["latency_ms"]["caption"] / 1000})
    return out


def cli_run(url: str, key: str, wav: Path) -> list[dict[str, float]]:
    lines = subprocess.run([str(BIN), "stream", str(wav), "--to", "es", "--from", "en", "--slo", "standard",
                            "--realtime", "--json", "--url", url, "--api-key", key], capture_output=True, text=True,
                           timeout=180, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    finals = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    return [{"latency_s": f["latency_s"], "server_caption_s": f["latency_ms"]["caption"] / 1000}
            for f in finals if f.get("type") == "final"]


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    lat = [r["latency_s"] for r in rows]
    srv = [r["server_caption_s"] for r in rows]
    return {"finals": len(rows), "median_s": round(statistics.median(lat), 3), "max_s": round(max(lat), 3),
            "server_median_s": round(statistics.median(srv), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18220)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "web_latency.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "talk.wav"
        speech_wav(wav)
        proc, url, key = serve(Path(tmp) / "state", args.port)
        try:
            cli_run(url, key, wav)  # warm-up (models, caches), not counted
            page: list[dict[str, float]] = []
            cli: list[dict[str, float]] = []
            for i in range(args.runs):
                p, c = page_run(url, key, wav), cli_run(url, key, wav)
                page += p
                cli += c
                print(f"run {i + 1}: page {[round(r['latency_s'], 3) for r in p]}  "
                      f"cli {[round(r['latency_s'], 3) for r in c]}", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    result: dict[str, Any] = {"runs": args.runs, "audio": " ".join(SENTENCES), "slo": "standard",
                              "page": summary(page), "cli": summary(cli)}
    result["ratio_page_over_cli_median"] = round(result["page"]["median_s"] / result["cli"]["median_s"], 2)
    print(json.dumps(result, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
