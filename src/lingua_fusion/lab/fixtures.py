"""Material the proof tools share: the built-in sentences, the slide renderer, run metadata for reports.

The load generator (loadgen/), the evaluation (eval/) and the chaos runner (chaos/) all use these. This module
imports nothing from the rest of lab/, so none of them has to import another just for its fixtures.
"""

from __future__ import annotations

import io
import os
import platform
import subprocess
from pathlib import Path
from typing import TypedDict

DATA = Path(__file__).parent / "eval" / "data"  # the built-in set's sentences (shipped as package data)


def builtin_sentences() -> list[tuple[str, str, str]]:
    """The built-in en-es sentences (we wrote them, with our own Spanish references): (id, en, es) rows."""
    rows = []
    for line in (DATA / "en_es.tsv").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            i, en, es = line.split("\t")
            rows.append((i, en, es))
    return rows


def slide_png(text: str, font_size: int = 40) -> bytes:
    """One line of text on a white 1280x720 slide (the load generator's and the built-in set's slides)."""
    from PIL import Image, ImageDraw, ImageFont

    font_path = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    font: ImageFont.FreeTypeFont | ImageFont.ImageFont = \
        ImageFont.truetype(font_path, font_size) if Path(font_path).exists() else ImageFont.load_default()
    img = Image.new("RGB", (1280, 720), "white")
    ImageDraw.Draw(img).text((60, 320), text, fill="black", font=font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def git_commit() -> str:
    """The checked-out commit, for the reports ("unknown" outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


class Machine(TypedDict):
    """Where a report was measured (its ``machine`` key)."""

    platform: str
    python: str
    cpus: int | None


def machine() -> Machine:
    """The machine a report was measured on."""
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
