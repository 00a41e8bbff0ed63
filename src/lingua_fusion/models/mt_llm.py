"""Gemma 3 270M (GGUF, llama-cpp-python): a tiny base LLM with a few-shot prompt, for pairs nothing else serves.

Labelled low-confidence everywhere: out of English it often changes facts (numbers, times, nouns).

llama.cpp is native code that can crash (a build that does not suit the CPU dies with SIGSEGV on the first
decode), so it never runs in the serving process: ``GemmaMT`` (what the registry serves) sends each batch to a
supervised worker process (``llm_worker.py``, supervise/), one round trip per batch. ``GemmaLlama`` is the model
itself, used only inside that worker.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import BackendError
from ..langs import name
from ..supervise import RestartPolicy, WorkerHealth, WorkerProcess
from .base import BackendInfo

LANGS = ("en", "zh", "de", "fr", "es")
EXAMPLES = {
    "en": ["Good morning.", "I have two brothers and a sister."],
    "es": ["Buenos días.", "Tengo dos hermanos y una hermana."],
    "fr": ["Bonjour.", "J'ai deux frères et une sœur."],
    "de": ["Guten Morgen.", "Ich habe zwei Brüder und eine Schwester."],
    "zh": ["早上好。", "我有两个哥哥和一个姐姐。"],
}
MAGIC = b"LFL1"  # the LLM worker's frames (supervise/wire.py)
INFO = BackendInfo(
    name="gemma3-270m-q4_k_m", task="mt", languages=LANGS,
    pairs=tuple((a, b) for a in LANGS for b in LANGS if a != b and "en" in (a, b)),
    licence="Gemma Terms of Use", low_confidence=True,
    quality="LOW CONFIDENCE: tiny base LLM; into English usable (BLEU 31-61), out of English often wrong",
)

log = logging.getLogger("lingua_fusion.llama_cpp")
_quiet_callback: Any = None  # kept referenced: llama.cpp calls it for as long as the process lives


def prompt(text: str, source: str, target: str) -> str:
    s, t = name(source), name(target)
    shots = "".join(f"{s}: {a}\n{t}: {b}\n\n" for a, b in zip(EXAMPLES[source], EXAMPLES[target], strict=True))
    return f"Translate from {s} to {t}.\n\n{shots}{s}: {text}\n{t}:"


def check_pair(source: str, target: str) -> None:
    if source not in EXAMPLES or target not in EXAMPLES:
        raise BackendError(f"gemma has no prompt for {source}-{target}")


class GemmaMT:
    """The registry's face of the LLM: ``translate`` sends the batch to the worker process and waits (bounded)."""

    info = INFO

    def __init__(self, gguf: Path, *, threads: int = 2, start_timeout_s: float = 60.0,
                 timeout_per_text_s: float = 20.0, policy: RestartPolicy | None = None) -> None:
        if not gguf.exists():
            raise BackendError(f"{gguf} missing; run `python -m lingua_fusion.models.assets`")
        self.timeout_per_text_s = timeout_per_text_s
        argv = [sys.executable, "-m", "lingua_fusion.models.llm_worker", "--gguf", str(gguf), "--threads", str(threads)]
        self.worker = WorkerProcess("llm-worker", argv, magic=MAGIC, start_timeout_s=start_timeout_s, policy=policy)

    def translate(self, texts: list[str], source: str, target: str) -> list[str]:
        check_pair(source, target)
        if not any(t.strip() for t in texts):
            return ["" for _ in texts]
        body, _ = self.worker.call({"op": "translate", "texts": texts, "source": source, "target": target},
                                   timeout_s=self.timeout_per_text_s * max(1, len(texts)))
        out = body.get("texts")
        if not isinstance(out, list) or len(out) != len(texts) or not all(isinstance(t, str) for t in out):
            raise BackendError("the LLM worker's answer does not match its request")
        return out

    def hello(self) -> dict[str, Any]:
        """Start the worker if needed: llama.cpp's version and the CPU features its build uses."""
        body, _ = self.worker.call({"op": "hello"}, timeout_s=self.timeout_per_text_s)
        return body

    def health(self) -> WorkerHealth:
        return self.worker.health()

    def close(self) -> None:
        self.worker.close()


def _silence_llama_cpp() -> None:
    """llama.cpp writes notes ("llama_kv_cache_iswa: using full-size SWA cache ...") straight to stderr even with
    verbose=False: send them to our debug log instead."""
    global _quiet_callback
    if _quiet_callback is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def quiet(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        log.debug("%s", text.decode("utf-8", "replace").rstrip())

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    _quiet_callback = quiet


class GemmaLlama:
    """The model in this process (the LLM worker's; never the server's)."""

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

    def translate(self, texts: list[str], source: str, target: str) -> list[str]:
        check_pair(source, target)
        out = []
        with self._lock:
            for text in texts:
                if not text.strip():
                    out.append("")
                    continue
                r = self._llm(prompt(text, source, target), max_tokens=min(256, 8 + 3 * len(text)),
                              temperature=0.0, stop=["\n"])
                assert isinstance(r, dict)  # not a stream (stream=False)
                out.append(r["choices"][0]["text"].strip())
        return out
