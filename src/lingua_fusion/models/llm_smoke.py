"""The set-up's proof that llama.cpp's build runs on this machine: ``python -m lingua_fusion.models.llm_smoke``.

Starts the supervised LLM worker (a child process, as the server does), prints the CPU features its build uses and
one real translation, and exits 1 with a message when the worker crashes or answers nothing (a build that does
not suit this CPU), instead of leaving that to the server's first German request.
"""

from __future__ import annotations

import re
import sys
import time

from ..config import Settings
from ..errors import LinguaFusionError
from .mt_llm import GemmaMT


def main() -> int:
    settings = Settings()
    gguf = settings.models.cache_dir / "gemma3-270m-q4_k_m.gguf"
    started = time.monotonic()
    try:
        mt = GemmaMT(gguf, threads=settings.models.asr_threads)
        try:
            hello = mt.hello()
            german = mt.translate(["Good morning, everyone."], "en", "de")[0]
        finally:
            mt.close()
    except LinguaFusionError as exc:
        print(f"[setup] llama.cpp smoke test FAILED: {exc.message}", file=sys.stderr)
        return 1
    on = [k for k, v in re.findall(r"(\w+) = (\d)", str(hello.get("system_info", ""))) if v == "1"]
    print(f"[setup] llama-cpp-python {hello.get('llama_cpp')} runs in a worker process; CPU features its build "
          f"uses: {', '.join(on) or 'none reported'}")
    print(f"[setup] smoke translation en->de in {time.monotonic() - started:.1f} s: "
          f"'Good morning, everyone.' -> {german!r}")
    if not german.strip():
        print("[setup] llama.cpp smoke test FAILED: an empty translation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
