"""MT from a model directory the user supplies: CTranslate2 or transformers (Marian / NLLB / M2M100).

Nothing on PyPI or Debian ships OPUS-MT / NLLB weights, so production-quality pairs such as en<->zh come from a
directory the operator provides. The directory holds the model (CTranslate2 ``model.bin`` or transformers
``config.json`` + weights), a Hugging Face tokenizer, and ``linguafusion.json``::

    {"name": "opus-mt-en-zh", "pairs": [["en", "zh"]], "licence": "CC-BY-4.0",
     "lang_codes": {"en": "eng_Latn", "zh": "zho_Hans"}}   # lang_codes only for NLLB / M2M100

Register directories with ``LINGUAFUSION_MODELS__USER_MT_DIRS='["/path/a", "/path/b"]'``.

With the continuous engine on (``models.engine``), a transformers directory whose decoder the engine has
(``ENGINE_TYPES``) is decoded there instead (serving/gpu/torch_mt.py): this class then only tokenizes
(``token_ids``, ``target_token``) and reads tokens back (``detokenize``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ..errors import BackendError
from .base import BackendInfo

MANIFEST = "linguafusion.json"
MAX_SOURCE_TOKENS = 512
MAX_NEW_TOKENS = 256
ENGINE_TYPES = ("marian", "m2m_100")  # transformers model types with a decoder in serving/gpu/models.py (NLLB: m2m_100)


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / MANIFEST).read_text())
        pairs = [tuple(p) for p in meta["pairs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackendError(f"{path}: missing or invalid {MANIFEST}: {exc}") from exc
    meta["pairs"] = pairs
    return meta


def model_type(path: Path) -> str | None:
    """The transformers ``model_type`` of a directory (None: CTranslate2, or no readable config.json)."""
    if (path / "model.bin").exists():
        return None
    try:
        return str(json.loads((path / "config.json").read_text())["model_type"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def new_token_limit(model: Any) -> int:
    """The most tokens one translation may generate: the directory's ``generation_config.max_new_tokens`` where it
    sets one (as ``generate`` reads it), within ``MAX_NEW_TOKENS``."""
    configured = model.generation_config.max_new_tokens  # a transformers model's (None unless the directory sets it)
    return min(MAX_NEW_TOKENS, int(configured)) if isinstance(configured, int) and configured > 0 else MAX_NEW_TOKENS


class LocalDirMT:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        meta = read_manifest(self.path)
        self._codes: dict[str, str] = meta.get("lang_codes", {})
        self.format = "ctranslate2" if (self.path / "model.bin").exists() else "transformers"
        langs = sorted({x for p in meta["pairs"] for x in p})
        self.info = BackendInfo(name=meta.get("name", self.path.name), task="mt", languages=tuple(langs),
                                pairs=tuple(meta["pairs"]), licence=meta.get("licence", "user-supplied"),
                                quality=f"user-supplied {self.format} model")
        self._lock = threading.Lock()
        try:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(self.path))
            if self.format == "ctranslate2":
                import ctranslate2

                self._ct2 = ctranslate2.Translator(str(self.path), device="cpu")
                self._hf = None
            else:
                from transformers import AutoModelForSeq2SeqLM

                self._hf = AutoModelForSeq2SeqLM.from_pretrained(str(self.path))
                self._hf.eval()
                self._ct2 = None
        except ImportError as exc:
            raise BackendError("transformers is needed for user model directories (extra 'hf')") from exc
        except (OSError, ValueError, RuntimeError) as exc:
            raise BackendError(f"cannot load model directory {self.path}: {exc}") from exc

    def _set_src(self, source: str) -> None:
        if source in self._codes and hasattr(self._tok, "src_lang"):
            self._tok.src_lang = self._codes[source]

    @property
    def model(self) -> Any:
        """The transformers model (None for a CTranslate2 directory)."""
        return self._hf

    def check_pair(self, source: str, target: str) -> None:
        if (source, target) not in self.info.pairs:
            raise BackendError(f"{self.info.name} does not serve {source}-{target}")

    def token_ids(self, texts: list[str], source: str) -> list[list[int]]:
        """Each text's encoder input ids (the source language's code where the tokenizer adds one)."""
        with self._lock:  # src_lang is the tokenizer's state
            self._set_src(source)
            return [list(ids) for ids in self._tok(texts, truncation=True, max_length=MAX_SOURCE_TOKENS)["input_ids"]]

    def target_token(self, target: str) -> int | None:
        """The token that starts a translation into ``target`` (NLLB / M2M100 language codes), if any."""
        code = self._codes.get(target)
        if not code:
            return None
        token = self._tok.convert_tokens_to_ids(code)
        assert isinstance(token, int)  # one token's id (a list of tokens gives a list)
        return token

    def detokenize(self, sequences: Any) -> list[str]:
        """Texts of token sequences (lists, or generate()'s tensor); special tokens dropped."""
        return [t.strip() for t in self._tok.batch_decode(sequences, skip_special_tokens=True)]

    def translate(self, texts: list[str], source: str, target: str) -> list[str]:
        self.check_pair(source, target)
        if not texts:
            return []
        with self._lock:
            self._set_src(source)
            tgt_code = self._codes.get(target)
            if self._ct2 is not None:
                batch = [self._tok.convert_ids_to_tokens(self._tok.encode(t)) for t in texts]
                prefix = [[tgt_code]] * len(texts) if tgt_code else None
                res = self._ct2.translate_batch(batch, target_prefix=prefix, beam_size=2,
                                                max_decoding_length=MAX_NEW_TOKENS)
                out = []
                for r in res:
                    toks = r.hypotheses[0]
                    if tgt_code and toks and toks[0] == tgt_code:
                        toks = toks[1:]
                    text = self._tok.decode(self._tok.convert_tokens_to_ids(toks), skip_special_tokens=True)
                    assert isinstance(text, str)  # one sequence's text (a batch gives a list)
                    out.append(text)
                return [o.strip() for o in out]
            import torch

            assert self._hf is not None  # a transformers directory (no CTranslate2 translator)
            enc = self._tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=MAX_SOURCE_TOKENS)
            kwargs: dict[str, Any] = {"max_new_tokens": new_token_limit(self._hf), "num_beams": 2}
            if tgt_code:
                kwargs["forced_bos_token_id"] = self._tok.convert_tokens_to_ids(tgt_code)
            with torch.no_grad():
                gen = self._hf.generate(**enc, **kwargs)
        return self.detokenize(gen)
