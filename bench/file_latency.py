"""Issue-2 figures: per-stage latency and RTF for a 30 s English talk -> Spanish text and -> Spanish speech,
OCR+MT for one slide, cold vs warm, and the peak RSS of a server with every default model loaded.

    .venv/bin/python bench/file_latency.py --json bench/results/file_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

TALK = ("Good morning everyone and welcome to the quarterly review. The new office will open in the spring. "
        "Please send me the report before Friday. We need more time to finish the project. The meeting starts at "
        "ten and ends at noon. Our team has grown by twelve people this year. Sales in the north region were "
        "strong, while the south was flat. We will hire two engineers next month. The budget for travel is "
        "lower than last year. Thank you all for your hard work. Questions are welcome at the end of the session.")


def make_media(d: Path) -> dict[str, Path]:
    from conftest import piper_wav, render_slide

    talk = d / "talk30.wav"
    talk.write_bytes(piper_wav(TALK))
    slide = d / "slide.png"
    slide.write_bytes(render_slide(["Quarterly results", "Revenue grew by twelve percent", "Next meeting on Monday"]))
    return {"talk": talk, "slide": slide}


def server_rss(media: dict[str, Path]) -> dict[str, object]:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import start_server, stop_server

    with tempfile.TemporaryDirectory() as state:
        url, proc = start_server(Path(state), "--no-auth")
        try:
            rss_ready = _vm(proc.pid, "VmRSS")
            calls = [
                {"files": {"file": ("t.wav", media["talk"].read_bytes())}, "data": {"source_modality": "audio",
                                                                                  "target_lang": "es",
                                                                                  "source_lang": "en"}},
                {"files": {"file": ("t.wav", media["talk"].read_bytes())}, "data": {"source_modality": "audio",
                                                                                  "target_lang": "es"}},
                {"files": {"file": ("s.png", media["slide"].read_bytes())}, "data": {"source_modality": "image",
                                                                                   "target_lang": "es"}},
                {"data": {"text": "The house is big.", "source_lang": "en", "target_lang": "pt"}},
                {"data": {"text": "The house is big.", "source_lang": "en", "target_lang": "de"}},
                {"data": {"text": "Hello.", "source_lang": "en", "target_lang": "en", "target_modality": "speech"}},
                {"data": {"text": "Hello.", "source_lang": "en", "target_lang": "es", "target_modality": "speech"}},
            ]
            for c in calls:
                r = httpx.post(url + "/v1/translate", timeout=300, **c)
                r.raise_for_status()
            loaded = httpx.get(url + "/readyz", timeout=10).json()["loaded"]
            return {"rss_after_warmup_mib": rss_ready, "peak_rss_all_models_mib": _vm(proc.pid, "VmHWM"),
                    "rss_all_models_mib": _vm(proc.pid, "VmRSS"), "models_loaded": loaded}
        finally:
            stop_server(proc)


def _vm(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return -1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/file_latency.json")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from lingua_fusion.files import FileTranslator
    from lingua_fusion.lab.benchfile import run_file_bench

    with tempfile.TemporaryDirectory() as d:
        media = make_media(Path(d))
        report: dict[str, object] = {"schema": "linguafusion.bench.issue2/1", "machine": platform.platform(),
                                     "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        eng = FileTranslator()  # one engine: the first call of each scenario is cold only for models not yet loaded
        report["speech_to_text_es"] = run_file_bench(media["talk"], to="es", source_lang="en", repeat=args.repeat,
                                                     engine=eng)
        report["speech_to_speech_es"] = run_file_bench(media["talk"], to="es", source_lang="en",
                                                       target_modality="speech", repeat=args.repeat, engine=eng)
        report["slide_ocr_mt_es"] = run_file_bench(media["slide"], to="es", source_lang="en", repeat=args.repeat,
                                                   engine=eng)
        eng.close()
        report["server"] = server_rss(media)
    try:
        report["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=ROOT, timeout=5).stdout.strip()
    except OSError:
        pass
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
