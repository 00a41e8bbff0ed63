"""Text -> Unicode braille with liblouis (Debian ``liblouis-bin``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..errors import BackendError, UnsupportedPair
from .base import BackendInfo

TABLES_DIR = Path("/usr/share/liblouis/tables")
TABLES = {"en": "en-us-g2.ctb", "es": "es-g1.ctb", "fr": "fr-bfu-g2.ctb", "de": "de-g2.ctb", "pt": "pt-pt-g1.utb",
          "ca": "ca-g1.ctb", "it": "it-it-comp6.utb", "zh": "zh-chn.ctb"}


class LouisBraille:
    def __init__(self) -> None:
        if shutil.which("lou_translate") is None:
            raise BackendError("liblouis-bin is not installed")
        self._tables = {k: v for k, v in TABLES.items() if (TABLES_DIR / v).exists()}
        self.info = BackendInfo(name="liblouis", task="braille", languages=tuple(sorted(self._tables)),
                                licence="LGPL-2.1+", quality="contracted (grade 2) where the table has it")

    def translate(self, text: str, *, language: str) -> str:
        table = self._tables.get(language)
        if table is None:
            raise UnsupportedPair(f"no braille table for {language}",
                                  details={"braille_languages": sorted(self._tables)})
        lines = [" ".join(t.split()) for t in text.splitlines() if t.strip()] or [""]
        proc = subprocess.run(["lou_translate", "--forward", f"unicode.dis,{table}"],
                              input="\n".join(lines).encode("utf-8") + b"\n", capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise BackendError(f"liblouis failed: {proc.stderr.decode(errors='replace')[:200]}")
        return proc.stdout.decode("utf-8").rstrip("\n")
