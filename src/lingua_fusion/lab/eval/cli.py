"""Glue for ``linguafusion eval``: pick the set and the translator, run, study, report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ... import langs
from ...config import Settings
from ...errors import InvalidParameter
from ..fixtures import builtin_sentences
from . import testset
from .results import StudyResult, StudySkipped, is_study
from .runner import Translate, Translated, evaluate, report

if TYPE_CHECKING:
    from rich.console import Console


def _translator(url: str | None, api_key: str | None) -> tuple[Translate, dict[str, str]]:
    """The translate call and the models it runs (name -> task)."""
    from ...sdk import LocalTranslator, MultimodalTranslator

    client: MultimodalTranslator | LocalTranslator = \
        MultimodalTranslator(api_key=api_key, base_url=url) if url else LocalTranslator()

    def translate(*, data: bytes | None, text: str | None, source_modality: str, source_lang: str,
                  target_lang: str) -> Translated:
        return client.translate(data, text=text, source_modality=source_modality, source_lang=source_lang,
                                target_lang=target_lang)

    return translate, {m["name"]: m["task"] for m in client.models()["models"]}


def run_eval(*, set_dir: str, pair: str, html_out: Path | None, degrade: str, a: float, seed: int,
             make_set: Path | None, url: str | None, api_key: str | None, console: Console) -> dict[str, object]:
    if make_set is not None:
        testset.make_builtin(make_set)
        return {"schema": "linguafusion.eval.set/1", "written": str(make_set),
                "items": len(builtin_sentences())}
    try:
        source, target = (langs.normalize(x) for x in pair.split("-", 1))
    except ValueError as exc:
        raise InvalidParameter("--pair must look like en-es") from exc
    if set_dir == "builtin":
        if (source, target) != ("en", "es"):
            raise InvalidParameter("the built-in set is en-es; pass --set DIR for other pairs")
        folder = Settings().models.cache_dir / "evalsets" / "builtin-en-es"
        if not (folder / "text").is_dir():
            console.print(f"writing the built-in set to {folder}", markup=False)
            testset.make_builtin(folder)
    else:
        folder = Path(set_dir)
    items = testset.load(folder, source, target)
    translate, models = _translator(url, api_key)
    results = evaluate(items, source, target, translate)
    extra: dict[str, list[StudyResult | StudySkipped]] = {}
    studies = [s.strip() for s in degrade.split(",") if s.strip()]
    if studies:
        from .study import run_study

        extra["studies"] = [run_study(s, items, source, target, translate, a=a, seed=seed) for s in studies]
    rep = report(str(set_dir), f"{source}-{target}", results,
                 models=models,
                 config={"url": url, "a": a, "seed": seed, "degrade": studies}, extra=extra)
    if html_out is not None:
        from .report import plot_study, write_html

        html_out.parent.mkdir(parents=True, exist_ok=True)
        images = [plot_study(st, html_out.with_name(f"{html_out.stem}-{st['study']}.png"))
                  for st in extra.get("studies", []) if is_study(st)]
        write_html(html_out, f"LinguaFusion eval {source}-{target} on {set_dir}", rep, images)
    return rep
