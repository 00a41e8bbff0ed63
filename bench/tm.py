"""Translation memory: hit rate, MT calls saved and MT time saved on a realistic mix, with real Apertium.

    .venv/bin/python bench/tm.py --json bench/results/tm.json [--redis redis://127.0.0.1:6379/0]

The mix: one slide deck (15 slides, 4 lines each) presented in 4 rooms (each translated into es and ca; each
room's talk shows every slide, says stock phrases such as "Next slide, please." and revisits 3 slides in the
questions), and 20 users translating the same deck into es over REST. Every segment goes through
``TranslationMemory.translate`` with the real route translator, as the stream engine's MT runner and the REST file
path call it; the baseline is the same mix with no memory, in the same run. With ``--redis``, the rooms are split
over two gateways (two memories sharing the Redis tier): the second gateway's misses are served from Redis.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

TOPICS = ["sales", "the new office", "customer support", "the mobile app", "hiring", "the budget", "security",
          "the roadmap", "training", "suppliers", "energy use", "the website", "partnerships", "quality", "travel"]
STOCK = ["Next slide, please.", "As you can see on this slide, the numbers are clear.",
         "Let me go back to the previous slide.", "Are there any questions so far?", "Thank you for your attention."]
WORDS = ["market", "team", "city", "report", "river", "office", "project", "plan", "price", "result", "year",
         "school", "house", "road", "garden"]


def deck() -> list[list[str]]:
    return [[f"Slide {i + 1}: {topic.capitalize()}", f"Our goals for {topic} this year",
             f"What changed in {topic} since last spring", f"Next steps for {topic}"]
            for i, topic in enumerate(TOPICS)]


def talk(rng: random.Random, slides: list[list[str]]) -> list[list[str]]:
    """One room's segments in the order they are translated: each slide's lines, the speaker's sentences (unique
    ones and stock phrases), then three slides again in the questions."""
    out: list[list[str]] = []
    for slide in slides:
        out.append(slide)
        for _ in range(3):
            w1, w2 = rng.sample(WORDS, 2)
            out.append([f"The {w1} and the {w2} are important for us."
                        if rng.random() < 0.6 else rng.choice(STOCK)])
    for slide in rng.sample(slides, 3):
        out.append(slide)
    return out


def run_mix(tm: Any, tm2: Any, translators: dict[str, Any], route_keys: dict[str, str],
            rooms: list[list[list[str]]], users: int, slides: list[list[str]]) -> dict[str, Any]:
    asked = 0
    sent = [0]
    mt_s = [0.0]

    def counted(fn: Any) -> Any:
        def run(texts: list[str]) -> list[str]:
            sent[0] += len(texts)
            t0 = time.perf_counter()
            try:
                return list(fn(texts))
            finally:
                mt_s[0] += time.perf_counter() - t0
        return run

    def translate(memory: Any, lang: str, batch: list[str]) -> None:
        nonlocal asked
        asked += len(batch)
        fn = counted(translators[lang])
        if memory is None:
            fn(batch)
        else:
            memory.translate(route_keys[lang], batch, [()] * len(batch), fn)

    t0 = time.perf_counter()
    for r, segments in enumerate(rooms):  # rooms interleave in reality; order does not change hits here
        memory = tm2 if (tm2 is not None and r % 2) else tm
        for batch in segments:
            for lang in ("es", "ca"):
                translate(memory, lang, batch)
    for _ in range(users):
        for slide in slides:
            translate(tm, "es", slide)
    return {"segments_asked": asked, "segments_translated_by_mt": sent[0], "mt_seconds": round(mt_s[0], 3),
            "wall_seconds": round(time.perf_counter() - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rooms", type=int, default=4)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--redis", default=None)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/tm.json")
    args = ap.parse_args()

    from lingua_fusion.config import Settings
    from lingua_fusion.lab.fixtures import git_commit, machine
    from lingua_fusion.models.registry import Registry
    from lingua_fusion.tm.lru import LRU
    from lingua_fusion.tm.memory import TranslationMemory
    from lingua_fusion.tm.shared import SharedTier

    registry = Registry(Settings())
    routes = {lang: registry.mt_route("en", lang) for lang in ("es", "ca")}
    translators = {lang: registry.route_translator(r) for lang, r in routes.items()}
    route_keys = {lang: registry.route_key(r) + f" #bench-{time.time()}" for lang, r in routes.items()}
    for fn in translators.values():
        fn(["Warm up."])  # the Apertium pipes start outside the figures
    slides = deck()
    rng = random.Random(7)
    rooms = [talk(rng, slides) for _ in range(args.rooms)]

    baseline = run_mix(None, None, translators, route_keys, rooms, args.users, slides)

    def memory() -> TranslationMemory:
        shared = SharedTier(args.redis, 3600) if args.redis else None
        return TranslationMemory(LRU(50_000, 64 * 1024 * 1024, 3600), shared)

    tm = memory()
    tm2 = memory() if args.redis else None
    cached = run_mix(tm, tm2, translators, route_keys, rooms, args.users, slides)
    stats = [tm.stats] + ([tm2.stats] if tm2 is not None else [])
    hits_local = sum(s.hits_local for s in stats)
    hits_shared = sum(s.hits_shared for s in stats)
    asked = cached["segments_asked"]
    out = {"bench": "tm", "mix": {"rooms": args.rooms, "languages_per_room": 2, "rest_users": args.users,
                                  "slides": len(slides), "lines_per_slide": 4, "gateways": 2 if args.redis else 1},
           "baseline_no_memory": baseline, "with_memory": cached,
           "hit_rate": round((hits_local + hits_shared) / asked, 3), "hits_local": hits_local,
           "hits_shared": hits_shared, "mt_calls_saved": baseline["segments_translated_by_mt"]
           - cached["segments_translated_by_mt"],
           "mt_calls_saved_share": round(1 - cached["segments_translated_by_mt"]
                                         / baseline["segments_translated_by_mt"], 3),
           "mt_time_ratio": round(cached["mt_seconds"] / baseline["mt_seconds"], 3),
           "commit": git_commit(), "machine": machine()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("machine",)}, indent=2))
    tm.close()
    if tm2 is not None:
        tm2.close()


if __name__ == "__main__":
    main()
