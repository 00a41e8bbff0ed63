"""Degradation study: quality (BLEU, WER, joint = BLEU - a*WER*100) against degradation level, and the knee."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from ...config import LimitSettings
from ...media import decode_audio, decode_image
from ...models.tts import to_wav
from ..chaos import degrade
from . import quality
from .results import StudyResult, StudyRow, StudySkipped
from .runner import Translate, evaluate
from .testset import Item


def _transform(study: str, level: float, seed: int) -> Callable[[Item], tuple[bytes | None, str | None]]:
    def run(it: Item) -> tuple[bytes | None, str | None]:
        assert it.media is not None
        raw = it.media.read_bytes()
        item_seed = seed + sum(map(ord, it.id))
        if it.modality == "audio":
            audio, _ = decode_audio(raw, LimitSettings())
            out = degrade.apply(study, level, audio=audio, seed=item_seed)
            return to_wav((np.clip(out, -1, 1) * 32767).astype(np.int16), 16000), None
        from PIL import Image

        img = degrade.apply(study, level, image=decode_image(raw, LimitSettings()), seed=item_seed)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        return buf.getvalue(), None

    return run


def knee(levels: list[float], joint: list[float]) -> int:
    """Index i of the step levels[i] -> levels[i+1] where the joint score falls fastest (per step)."""
    drops = [joint[i] - joint[i + 1] for i in range(len(joint) - 1)]
    return int(np.argmax(drops)) if drops else 0


def run_study(study: str, items: list[Item], source: str, target: str, translate: Translate, *,
              a: float = 0.6, seed: int = 0, bootstrap: int = 200) -> StudyResult | StudySkipped:
    path, levels, label = degrade.STUDIES[study]
    modality = {"speech": "audio", "slides": "image"}[path]
    chosen = [it for it in items if it.modality == modality]
    if not chosen:
        return {"study": study, "skipped": f"the set has no {path} items"}
    rows: list[StudyRow] = []
    per_item: list[list[tuple[str, str, str, str]]] = []
    for level in levels:
        res = evaluate(chosen, source, target, translate, transform=_transform(study, level, seed))["paths"][path]
        wer, outputs = res.get("wer", 0.0), res.get("outputs", [])  # evaluate sets both on every path
        rows.append({"level": level, "bleu": res["bleu"]["score"], "chrf": res["chrf"]["score"], "wer": wer,
                     "joint": quality.joint_score(res["bleu"]["score"], wer, a)})
        per_item.append([(o["translation"], it.target_ref, o["source"], it.source_ref)
                         for o, it in zip(outputs, chosen, strict=True)])
    joint = [r["joint"] for r in rows]
    k = knee(levels, joint)
    # confidence: how often the same step is the knee when the items are resampled with replacement
    r = np.random.default_rng(seed)
    agree = 0
    n = len(chosen)
    for _ in range(bootstrap):
        idx = r.integers(0, n, n)
        js = []
        for lvl in per_item:
            hyps = [lvl[i][0] for i in idx]
            refs = [lvl[i][1] for i in idx]
            w = quality.wer([lvl[i][2] for i in idx], [lvl[i][3] for i in idx])
            js.append(quality.joint_score(quality.bleu(hyps, refs)["score"], w, a))
        agree += knee(levels, js) == k
    return {"study": study, "path": path, "axis": label, "a": a, "seed": seed, "rows": rows,
            "knee": {"from_level": levels[k], "to_level": levels[min(k + 1, len(levels) - 1)],
                     "joint_drop": round(joint[k] - joint[min(k + 1, len(joint) - 1)], 2),
                     "confidence": round(agree / bootstrap, 3), "bootstrap_samples": bootstrap}}
