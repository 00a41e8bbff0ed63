"""Gemma 3 270M (GGUF, llama-cpp-python): a tiny base LLM with a few-shot prompt, for pairs nothing else serves.

Labelled low-confidence everywhere: out of English it often changes facts (numbers, times, nouns).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

from ..errors import BackendError
from ..langs import name
from .base import BackendInfo

LANGS = ("en", "zh", "de", "fr", "es")
EXAMPLES = {
    "en": ["Good morning.", "I have two brothers and a sister."],
    "es": ["Buenos días.", "Tengo dos hermanos y una hermana."],
    "fr": ["Bonjour.", "J'ai deux frères et une sœur."],
    "de": ["Guten Morgen.", "Ich habe zwei Brüder und eine Schwester."],
    "zh": ["早上好。", "我有两个哥哥和一个姐姐。"],
}


log = logging.getLogger("lingua_fusion.llama_cpp")
_quiet_callback: Any = None  # kept referenced: llama.cpp calls it for as long as the process lives


def _silence_llama_cpp() -> None:
    """llama.cpp writes notes ("llama_kv_cache_iswa: using full-size SWA cache ...") straight to stderr even with
    verbose=False, where they land in the middle of the CLI's output: send them to our debug log instead."""
    global _quiet_callback
    if _quiet_callback is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def quiet(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        log.debug("%s", text.decode("utf-8", "replace").rstrip())

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    _quiet_callback = quiet


class GemmaMT:
    info = BackendInfo(
        name="gemma3-270m-q4_k_m", task="mt", languages=LANGS,
        pairs=tuple((a, b) for a in LANGS for b in LANGS if a != b and "en" in (a, b)),
        licence="Gemma Terms of Use", low_confidence=True,
        quality="LOW CONFIDENCE: tiny base LLM; into English usable (BLEU 31-61), out of English often wrong",
    )

    def __init__(self, gguf: Path, threads: int = 2) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise BackendError("llama-cpp-python is not installed (extra 'llm')") from exc
        _silence_llama_cpp()
        if not gguf.exists():
            raise BackendError(f"{gguf} missing; run `python -m lingua_fusion.models.assets`")
        self._llm = Llama(model_path=str(gguf), n_ctx=1024, n_threads=threads, verbose=False)
        self._lock = threading.Lock()

    def _prompt(self, text: str, source: str, target: str) -> str:
        s, t = name(source), name(target)
        shots = "".join(f"{s}: {a}\n{t}: {b}\n\n" for a, b in zip(EXAMPLES[source], EXAMPLES[target], strict=True))
        return f"Translate from {s} to {t}.\n\n{shots}{s}: {text}\n{t}:"

    def translate(self, texts: list[str], source: str, target: str) -> list[str]:
        if source not in EXAMPLES or target not in EXAMPLES:
            raise BackendError(f"gemma has no prompt for {source}-{target}")
        out = []
        with self._lock:
            for text in texts:
                if not text.strip():
                    out.append("")
                    continue
                r = self._llm(self._prompt(text, source, target), max_tokens=min(256, 8 + 3 * len(text)),
                              temperature=0.0, stop=["\n"])
                out.append(r["choices"][0]["text"].strip())
        return out
