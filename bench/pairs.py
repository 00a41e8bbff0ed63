"""Every served pair among en, es, fr, de, ca, pt, zh, through every route the registry could take (direct, and
each pivot), measured with chrF on held-out conference sentences (src/lingua_fusion/lab/eval/data/conference.tsv:
our own sentences and translations, never used to write a rule or a post-edit). Writes the table the server
routes by (src/lingua_fusion/models/route_quality.json: the best measured route per pair wins; a route below
LOW_CHRF is labelled low-confidence whatever its engine) and prints it.

    .venv/bin/python bench/pairs.py                      # all pairs (the tiny LLM's legs take a few minutes)
    .venv/bin/python bench/pairs.py --pairs en-fr,en-es
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sacrebleu.metrics import CHRF  # noqa: E402

from lingua_fusion.config import Settings  # noqa: E402
from lingua_fusion.models.registry import Registry  # noqa: E402
from lingua_fusion.models.routes import ROUTE_QUALITY, MTRoute  # noqa: E402
from lingua_fusion.untranslated import strip_marks  # noqa: E402

DATA = ROOT / "src" / "lingua_fusion" / "lab" / "eval" / "data" / "conference.tsv"
LANGS = ("en", "es", "fr", "de", "ca", "pt", "zh")


def load() -> dict[str, list[str]]:
    rows = [r for r in csv.reader(DATA.open(encoding="utf-8"), delimiter="\t") if r and not r[0].startswith("#")]
    return {lang: [r[i + 1] for r in rows] for i, lang in enumerate(LANGS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="")
    ap.add_argument("--out", type=Path, default=ROUTE_QUALITY)
    args = ap.parse_args()
    settings = Settings()
    settings.tm.enabled = False  # every route translates for real
    registry = Registry(settings)
    columns = load()
    served = set(registry.served_pairs())
    wanted = [p for p in (args.pairs.split(",") if args.pairs else
                          [f"{a}-{b}" for a in LANGS for b in LANGS if a != b]) if p in served]
    cache: dict[tuple[str, str, str, str], str] = {}

    def run(route: MTRoute, texts: list[str]) -> tuple[list[str], int]:
        unknown = 0
        for leg in route.legs:
            todo = [t for t in texts if (leg.backend, leg.source, leg.target, t) not in cache]
            if todo:
                for t, out in zip(todo, registry.mt(leg.backend).translate(todo, leg.source, leg.target),
                                  strict=True):
                    cache[(leg.backend, leg.source, leg.target, t)] = out
            texts = [cache[(leg.backend, leg.source, leg.target, t)] for t in texts]
        clean = []
        for t in texts:
            text, words = strip_marks(t)
            clean.append(text)
            unknown += len(words)
        return clean, unknown

    table: dict[str, dict[str, object]] = {}
    started = time.monotonic()
    for pair in wanted:
        a, b = pair.split("-")
        scores = {}
        for route in registry.candidate_routes(a, b):
            hyps, unknown = run(route, columns[a])
            score = round(CHRF().corpus_score(hyps, [columns[b]]).score, 1)
            scores[route.describe()] = {"chrf": score, "untranslated_words": unknown}
        best = max(scores, key=lambda k: float(scores[k]["chrf"]))  # type: ignore[arg-type]
        table[pair] = {"routes": scores, "best": best}
        print(f"{pair:6} " + "; ".join(f"{k}: {v['chrf']} ({v['untranslated_words']} unknown)"
                                       for k, v in sorted(scores.items(), key=lambda kv: -float(kv[1]["chrf"]))))
    metric = CHRF()
    metric.corpus_score(["a"], [["a"]])  # (sacrebleu gives a signature only once the metric has run)
    doc = {"metric": str(metric.get_signature()), "sentences": len(columns["en"]), "data": str(DATA.relative_to(ROOT)),
           "command": "python bench/pairs.py", "seconds": round(time.monotonic() - started, 1), "pairs": table}
    if args.pairs and args.out.exists():  # a partial run updates the pairs it measured
        old = json.loads(args.out.read_text())
        old["pairs"].update(table)
        doc["pairs"] = old["pairs"]
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    registry.close()


if __name__ == "__main__":
    main()
