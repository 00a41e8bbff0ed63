"""``linguafusion eval``: run a test set through the engine (in-process or a server) and score every path."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ... import __version__
from ...errors import LinguaFusionError
from ..fixtures import git_commit, machine
from . import quality
from .testset import Item

SCHEMA = "linguafusion.eval/1"
PATH_NAMES = {"audio": "speech", "image": "slides", "text": "text"}


def evaluate(items: list[Item], source: str, target: str, translate: Callable[..., Any],
             transform: Callable[[Item], tuple[bytes | None, str | None]] | None = None) -> dict[str, Any]:
    """Score each modality path. ``transform`` may degrade an item's media (returns (data, text))."""
    paths: dict[str, dict[str, list[Any]]] = {}
    errors: list[dict[str, str]] = []
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
        p = paths.setdefault(PATH_NAMES[it.modality], {"hyp": [], "ref": [], "src_hyp": [], "src_ref": [],
                                                        "ms": [], "ids": []})
        p["hyp"].append(hyp)
        p["ref"].append(it.target_ref)
        p["src_hyp"].append(hyp_src)
        p["src_ref"].append(it.source_ref)
        p["ms"].append(ms)
        p["ids"].append(it.id)
    out: dict[str, Any] = {}
    for name, p in paths.items():
        res: dict[str, Any] = {"items": len(p["ids"]), "bleu": quality.bleu(p["hyp"], p["ref"]),
                               "chrf": quality.chrf(p["hyp"], p["ref"]),
                               "latency_ms": {"p50": round(statistics.median(p["ms"]), 1),
                                              "p90": round(sorted(p["ms"])[int(0.9 * (len(p["ms"]) - 1))], 1),
                                              "mean": round(statistics.fmean(p["ms"]), 1)}}
        if name == "speech":
            res["wer"] = quality.wer(p["src_hyp"], p["src_ref"])
        elif name == "slides":
            res["cer"] = quality.cer(p["src_hyp"], p["src_ref"])
            res["wer"] = quality.wer(p["src_hyp"], p["src_ref"])
        else:
            res["wer"] = 0.0
        res["joint"] = quality.joint_score(res["bleu"]["score"], res["wer"])
        res["outputs"] = [{"id": i, "source": s, "translation": h} for i, s, h in
                          zip(p["ids"], p["src_hyp"], p["hyp"], strict=True)]
        out[name] = res
    return {"paths": out, "errors": errors}


def report(set_name: str, pair: str, results: dict[str, Any], *, models: dict[str, Any], config: dict[str, Any],
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA, "version": __version__, "commit": git_commit(), "machine": machine(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "set": set_name, "pair": pair,
            "config": config, "models": models, **results, **(extra or {})}
