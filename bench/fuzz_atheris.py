"""Coverage-guided fuzzing of the media decoders with atheris (libFuzzer), seeded from small valid containers.

    .venv/bin/pip install -c requirements/constraints-core.txt -e '.[fuzz]'   # atheris, optional
    .venv/bin/python bench/fuzz_atheris.py --runs 5000 --json bench/results/fuzz_atheris.json

Each input starts with a route byte (its value mod 3), the rest is the container:

  0  the file path, as a REST upload goes: sniff, then decode_image for an image, decode_audio for audio/video
  1  the live-stream path: the bytes fed in 4 KiB chunks to a StreamDecoder('webm'), as a WebSocket client sends
  2  the same with StreamDecoder('ogg')

Seeds: wav, mp3, ogg/opus, webm/opus, flac, png, jpeg and webp (0.5 s of tone, a 64x48 image) on route 0, and the
webm and ogg seeds on routes 1 and 2. Counted as in bench/fuzz.py: an input is accepted, or fails with a client
error (4xx), or is a crash (any other exception, a LinguaFusionError that is not a client error included: both
would be a 5xx; or a stream decoder thread that ends without its end-of-stream or error), or a hang (no result in
--hang-s seconds; libFuzzer's own -timeout kills the run past --timeout-s and leaves the input in the artifacts).

Coverage feedback comes from the Python code only (atheris instruments lingua_fusion.media and Pillow's image
plugins, which parse PNG/JPEG/WebP headers in Python); FFmpeg under PyAV is C without coverage counters, so for
the audio containers libFuzzer's mutations are guided by the Python side alone.

The fuzzing runs in a child process (libFuzzer ends its process when done); the child rewrites its counters to a
file after every input, so the figures survive a libFuzzer timeout or out-of-memory stop.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUTES = ("file", "stream-webm", "stream-ogg")
CHUNK = 4096


# ---- seeds (parent process, not instrumented) ---------------------------------------------------------------------
def make_seeds() -> dict[str, bytes]:
    import io

    from PIL import Image

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import encode_audio
    from test_hostile_input import SEEDS  # wav, mp3, ogg/opus, png: the property tests' seeds

    seeds = dict(SEEDS)
    seeds["webm"] = encode_audio(seeds["wav"], "webm", "libopus")
    seeds["flac"] = encode_audio(seeds["wav"], "flac", "flac")
    img = Image.new("RGB", (64, 48), "white")
    for fmt in ("jpeg", "webp"):
        buf = io.BytesIO()
        img.save(buf, format=fmt.upper())
        seeds[fmt] = buf.getvalue()
    return seeds


# ---- the fuzz target (child process) ------------------------------------------------------------------------------
def child(stats_path: Path, hang_s: float, libfuzzer_args: list[str]) -> None:
    import threading

    import atheris

    with atheris.instrument_imports(include=["lingua_fusion.media", "PIL"]):
        from PIL import Image, JpegImagePlugin, PngImagePlugin, WebPImagePlugin  # noqa: F401 - instrumented now

        from lingua_fusion.media import decode_audio, decode_image, sniff
        from lingua_fusion.media.stream_decoder import StreamDecoder
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.errors import ClientError, LinguaFusionError

    limits = LimitSettings(max_media_seconds=30, max_image_pixels=4_000_000)
    stats: dict = {"executions": 0, "per_container": {}, "crash_samples": [], "hang_samples": [],
                   "slowest_decode_s": 0.0, "rss_start_kib": 0, "rss_kib": 0}

    def row(kind: str) -> dict[str, int]:
        return stats["per_container"].setdefault(
            kind, {"executions": 0, "accepted": 0, "client_errors": 0, "crashes": 0, "hangs": 0})

    def file_path(data: bytes) -> tuple[str, str]:
        kind = sniff(data)
        if kind.family == "image":
            decode_image(data, limits)
        elif kind.family in ("audio", "av"):
            decode_audio(data, limits)
        else:
            return kind.container, "rejected"  # the server refuses it before any decoder (415)
        return kind.container, "accepted"

    def stream_path(fmt: str, data: bytes) -> str:
        done = threading.Event()
        outcome: list[object] = []

        def sink(item: object) -> None:
            if item is None or isinstance(item, Exception):
                outcome.append(item)
                done.set()

        dec = StreamDecoder(fmt, sink, max_seconds=30)
        for i in range(0, len(data), CHUNK):
            dec.feed(data[i:i + CHUNK])
        dec.close()
        if not done.wait(hang_s):
            return "hang" if dec._thread.is_alive() else "silent-exit"
        if outcome[0] is None:
            return "accepted"
        raise outcome[0]  # type: ignore[misc]

    prefix = next((a.split("=", 1)[1] for a in libfuzzer_args if a.startswith("-artifact_prefix=")), None)
    saved = [0]

    def save(what: str, buf: bytes) -> None:  # like libFuzzer's own crash-/timeout- files, for the first 20
        if prefix and saved[0] < 20:
            saved[0] += 1
            Path(f"{prefix}{what}-{hashlib.sha1(buf).hexdigest()}").write_bytes(buf)

    def one(buf: bytes) -> None:
        route, data = ROUTES[buf[0] % 3] if buf else "file", buf[1:]
        kind = route if route != "file" else "?"
        t = time.monotonic()
        result, error = "crash", ""
        try:
            if route == "file":
                kind, result = file_path(data)
                if result == "rejected":
                    kind, result = "unrecognised", "client_error"
            else:
                result = stream_path(route.split("-")[1], data)
                if result == "silent-exit":
                    raise RuntimeError("decoder thread ended without end-of-stream or an error")
        except LinguaFusionError as exc:
            result = "client_error" if isinstance(exc, ClientError) else "crash"
            error = repr(exc)
        except Exception as exc:  # the finding this harness exists for
            error = repr(exc)
        dt = time.monotonic() - t
        if kind == "?":
            kind = sniff(data).container
        if result == "crash":
            stats["crash_samples"].append(f"{route}/{kind}: {error}"[:300])
            save("crash", buf)
        r = row(kind)
        r["executions"] += 1
        stats["executions"] += 1
        if result == "hang" or dt > hang_s:
            r["hangs"] += 1
            stats["hang_samples"].append(f"{route}/{kind}: {dt:.1f} s, {len(data)} bytes")
            save("slow", buf)
        if result == "hang":
            pass  # no outcome to count: the decoder is still running
        elif result == "accepted":
            r["accepted"] += 1
        elif result == "client_error":
            r["client_errors"] += 1
        else:
            r["crashes"] += 1
        stats["slowest_decode_s"] = max(stats["slowest_decode_s"], round(dt, 3))
        stats["rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if not stats["rss_start_kib"]:
            stats["rss_start_kib"] = stats["rss_kib"]
        stats["crash_samples"] = stats["crash_samples"][:10]
        stats["hang_samples"] = stats["hang_samples"][:10]
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stats))
        os.replace(tmp, stats_path)

    atheris.Setup([sys.argv[0], *libfuzzer_args], one)
    atheris.Fuzz()


# ---- the driver (parent process) ----------------------------------------------------------------------------------
def _final_stats(log: str) -> dict[str, float]:
    out = {k: float(v) for k, v in re.findall(r"^stat::(\w+):\s+([\d.]+)", log, re.M)}
    m = re.search(r"^Done (\d+) runs in (\d+) second", log, re.M)
    if m:
        out["done_runs"] = float(m.group(1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5000, help="libFuzzer -runs")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer -seed (0 means random in libFuzzer)")
    ap.add_argument("--timeout-s", type=int, default=20, help="libFuzzer -timeout: one input longer ends the run")
    ap.add_argument("--hang-s", type=float, default=5.0, help="an input slower than this counts as a hang")
    ap.add_argument("--max-total-s", type=int, default=900, help="libFuzzer -max_total_time")
    ap.add_argument("--rss-limit-mb", type=int, default=2048, help="libFuzzer -rss_limit_mb")
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/fuzz_atheris.json")
    ap.add_argument("--artifacts", type=Path, default=ROOT / "bench/results/fuzz_atheris_artifacts",
                    help="where inputs that crashed, hung or ran out of memory are copied (only if any)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("libfuzzer", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.hang_s, args.libfuzzer)
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed: pip install -c requirements/constraints-core.txt -e '.[fuzz]'")
        return 2

    seeds = make_seeds()
    work = Path(tempfile.mkdtemp(prefix="fuzz-atheris-"))
    corpus, artifacts = work / "corpus", work / "artifacts"
    corpus.mkdir()
    artifacts.mkdir()
    for kind, data in seeds.items():
        (corpus / f"file-{kind}").write_bytes(b"\x00" + data)
    (corpus / "stream-webm").write_bytes(b"\x01" + seeds["webm"])
    (corpus / "stream-ogg").write_bytes(b"\x02" + seeds["ogg"])
    stats_path = work / "stats.json"
    lf = [str(corpus), f"-runs={args.runs}", f"-seed={args.seed}", f"-timeout={args.timeout_s}",
          f"-max_total_time={args.max_total_s}", f"-rss_limit_mb={args.rss_limit_mb}",
          f"-max_len={max(len(d) for d in seeds.values()) + 1}", f"-artifact_prefix={artifacts}/",
          "-print_final_stats=1"]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(stats_path), "--hang-s", str(args.hang_s),
           "--", *lf]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=args.max_total_s + 120,
                          cwd=ROOT)
    wall = time.monotonic() - t0
    log = proc.stdout + proc.stderr
    (work / "libfuzzer.log").write_text(log)
    st = json.loads(stats_path.read_text()) if stats_path.exists() else {"executions": 0, "per_container": {}}
    lf_stats = _final_stats(log)
    killed = {"timeout": "ALARM: working on the last Unit" in log or "ERROR: libFuzzer: timeout" in log,
              "out_of_memory": "out-of-memory" in log, "deadly_signal": "deadly signal" in log}
    found = sorted(p.name for p in artifacts.iterdir())
    if found:
        args.artifacts.mkdir(parents=True, exist_ok=True)
        for name in found:
            shutil.copy(artifacts / name, args.artifacts / name)
    crashes = sum(r["crashes"] for r in st["per_container"].values()) + int(killed["deadly_signal"])
    hangs = sum(r["hangs"] for r in st["per_container"].values()) + int(killed["timeout"])
    rep = {"schema": "linguafusion.bench.fuzz_atheris/1", "runs": args.runs, "seed": args.seed,
           "command": " ".join([".venv/bin/python", "bench/fuzz_atheris.py", *sys.argv[1:]]),
           "wall_s": round(wall, 1), "executions": st["executions"],
           "exec_per_s": round(st["executions"] / wall, 1) if wall else 0.0,
           "per_container": dict(sorted(st["per_container"].items())),
           "crashes": crashes, "hangs": hangs, "out_of_memory": int(killed["out_of_memory"]),
           "slowest_decode_s": st.get("slowest_decode_s", 0.0),
           "peak_rss_growth_mib": round((st.get("rss_kib", 0) - st.get("rss_start_kib", 0)) / 1024, 1),
           "peak_rss_mib": round(st.get("rss_kib", 0) / 1024, 1),
           "libfuzzer": {"exit_code": proc.returncode, "new_units_added": int(lf_stats.get("new_units_added", 0)),
                         "corpus_files_after": len(list(corpus.iterdir())), "seeds": len(seeds) + 2,
                         "executed_units": int(lf_stats.get("number_of_executed_units", 0)),
                         "slowest_unit_time_sec": lf_stats.get("slowest_unit_time_sec", 0.0)},
           "crash_samples": st.get("crash_samples", []), "hang_samples": st.get("hang_samples", []),
           "artifacts": [str(args.artifacts / n) for n in found]}
    text = json.dumps(rep, indent=2)
    print(text)
    args.json.write_text(text + "\n")
    if proc.returncode != 0 and not any(killed.values()):
        print(log[-3000:], file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if crashes == 0 and hangs == 0 and not killed["out_of_memory"] else 1


if __name__ == "__main__":
    sys.exit(main())
