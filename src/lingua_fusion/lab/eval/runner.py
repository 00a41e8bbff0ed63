"""``linguafusion eval``: run a test set through the engine (in-process or a server) and score every path."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ... import __version__
from ...errors import LinguaFusionError
from ..fixtures import git_commit, machine
from . import quality
from .results import EvalError, EvalResults, PathResult
from .testset import Item


class Translated(Protocol):
    """What a translate call gives back (a TranslationResult, in process or from a server)."""

    source_text: str
    text: str


class Translate(Protocol):
    def __call__(self, *, data: bytes | None, text: str | None, source_modality: str, source_lang: str,
                 target_lang: str) -> Translated: ...


@dataclass
class _Path:
    hyp: list[str] = field(default_factory=list)
    ref: list[str] = field(default_factory=list)
    src_hyp: list[str] = field(default_factory=list)
    src_ref: list[str] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

SCHEMA = "linguafusion.eval/1"
PATH_NAMES = {"audio": "speech", "image": "slides", "text": "text"}


def evaluate(items: list[Item], source: str, target: str, translate: Translate,
             transform: Callable[[Item], tuple[bytes | None, str | None]] | None = None) -> EvalResults:
    """Score each modality path. ``transform`` may degrade an item's media (returns (data, text))."""
    paths: dict[str, _Path] = {}
    errors: list[EvalError] = []
    for it in items:
        data: bytes | None
        text: str | None
        if transform is not None:
            data, text = transform(it)
        else:
            data = it.media.read_bytes() if it.media else None
            text = None if it.media else it.source_ref
        t0 = time.perf_counter()
        try:
            r = translate(data=data, text=text, source_modality=it.modality, source_lang=source, target_lang=target)
            hyp_src, hyp = r.source_text, r.text
        except LinguaFusionError as exc:  # scored as empty output, and listed
            errors.append({"id": it.id, "path": PATH_NAMES[it.modality], "code": exc.code, "message": exc.message})
            hyp_src, hyp = "", ""
        ms = (time.perf_counter() - t0) * 1000
        p = paths.setdefault(PATH_NAMES[it.modality], _Path())
        p.hyp.append(hyp)
        p.ref.append(it.target_ref)
        p.src_hyp.append(hyp_src)
        p.src_ref.append(it.source_ref)
        p.ms.append(ms)
        p.ids.append(it.id)
    out: dict[str, PathResult] = {}
    for name, p in paths.items():
        res: PathResult = {"items": len(p.ids), "bleu": quality.bleu(p.hyp, p.ref), "chrf": quality.chrf(p.hyp, p.ref),
                           "latency_ms": {"p50": round(statistics.median(p.ms), 1),
                                          "p90": round(sorted(p.ms)[int(0.9 * (len(p.ms) - 1))], 1),
                                          "mean": round(statistics.fmean(p.ms), 1)}}
        if name == "speech":
            res["wer"] = wer = quality.wer(p.src_hyp, p.src_ref)
        elif name == "slides":
            res["cer"] = quality.cer(p.src_hyp, p.src_ref)
            res["wer"] = wer = quality.wer(p.src_hyp, p.src_ref)
        else:
            res["wer"] = wer = 0.0
        res["joint"] = quality.joint_score(res["bleu"]["score"], wer)
        res["outputs"] = [{"id": i, "source": s, "translation": h} for i, s, h in
                          zip(p.ids, p.src_hyp, p.hyp, strict=True)]
        out[name] = res
    return {"paths": out, "errors": errors}


def report(set_name: str, pair: str, results: Mapping[str, object], *, models: Mapping[str, object],
           config: Mapping[str, object], extra: Mapping[str, object] | None = None) -> dict[str, object]:
    return {"schema": SCHEMA, "version": __version__, "commit": git_commit(), "machine": machine(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "set": set_name, "pair": pair,
            "config": config, "models": models, **results, **(extra or {})}
