"""Issue 29's attack 6 as figures: key B's caption lateness (end of speech -> final) alone and beside key A's four
concurrent ``/v1/translate`` requests of a huge static video, on a live server (auth on, started here), once with
file threads at the server's priority (``server.file_nice=0``, the old behaviour for decoding) and once with the
default. The same attack is tests/service/test_fair_files.py (with a generous bound).

    .venv/bin/python bench/fair_files.py --json bench/results/fair_files.json
    .venv/bin/python bench/fair_files.py --make    # writes tests/data/static_6000x6000_20s.mp4 again (slow)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
VIDEO = ROOT / "tests" / "data" / "static_6000x6000_20s.mp4"


def make_video(path: Path, side: int = 6000, fps: int = 25, seconds: float = 20.0) -> None:
    """One blank ``side`` x ``side`` frame for ``seconds`` at ``fps``, H.264 (every frame must still be decoded)."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "35"}
        img = np.full((side, side, 3), 255, np.uint8)
        for i in range(int(fps * seconds)):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    path.write_bytes(buf.getvalue())


def _summary(late: list[float]) -> dict[str, float | int]:
    return {"captions": len(late), "median_s": round(statistics.median(late), 3) if late else -1.0,
            "max_s": round(max(late), 3) if late else -1.0}


async def figures(srv: Any) -> dict[str, Any]:
    from test_fair_files import post_video
    from test_fair_keys import honest_stream, speech_16k

    a, _ = srv.new_key("file-attacker")
    b, _ = srv.new_key("honest")
    audio, data = speech_16k(), VIDEO.read_bytes()
    out: dict[str, Any] = {"alone": _summary(await honest_stream(srv, b, audio))}
    t0 = time.monotonic()
    files = [asyncio.create_task(post_video(srv, a, data)) for _ in range(4)]
    await asyncio.sleep(3.0)
    out["beside_files"] = _summary(await honest_stream(srv, b, audio))
    answers = await asyncio.gather(*files)
    out["files"] = {"statuses": [r.status_code for r in answers], "seconds": round(time.monotonic() - t0, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "fair_files.json")
    ap.add_argument("--make", action="store_true", help="write the test video again and stop")
    args = ap.parse_args()
    if args.make:
        make_video(VIDEO)
        print(f"wrote {VIDEO} ({VIDEO.stat().st_size} bytes)")
        return
    from test_security import auth_server

    out: dict[str, Any] = {}
    for name, nice in (("file_nice_0", "0"), ("file_nice_default", None)):
        env = {"LINGUAFUSION_SERVER__FILE_NICE": nice} if nice is not None else None
        with auth_server(Path(tempfile.mkdtemp(prefix="fair-files-")), env=env) as srv:
            out[name] = asyncio.run(figures(srv))
        print(name, json.dumps(out[name]))
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
