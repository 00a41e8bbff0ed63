"""Server CPU per video frame message of a screen share (docs/benchmarks.md "Live video streams"): a 1280x720 slide
as JPEG decoded (media.decode_image) and its change-detection signature taken (video.slides.signature), as
``StreamVideo.feed`` does for every frame; process CPU time over 100 frames.

    .venv/bin/python bench/frame_cost.py
"""

from __future__ import annotations

import io
import json
import time

from PIL import Image

from lingua_fusion.config import LimitSettings
from lingua_fusion.lab.fixtures import slide_png
from lingua_fusion.media import decode_image
from lingua_fusion.video.slides import signature


def main() -> None:
    buf = io.BytesIO()
    Image.open(io.BytesIO(slide_png("Quarterly results and the plan for next year"))).convert("RGB").save(
        buf, format="JPEG", quality=80)  # what the load generator's video_fps frames are
    data, limits = buf.getvalue(), LimitSettings()
    for _ in range(5):
        signature(decode_image(data, limits))
    n = 100
    t0 = time.process_time()
    for _ in range(n):
        signature(decode_image(data, limits))
    cpu = (time.process_time() - t0) / n
    print(json.dumps({"jpeg_bytes": len(data), "cpu_ms_per_frame": round(cpu * 1000, 2)}))


if __name__ == "__main__":
    main()
