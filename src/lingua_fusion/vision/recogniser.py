"""A recogniser a user teaches: nearest neighbours under dynamic time warping over a vocabulary of examples.

Each gloss (a sign or a lip keyword) has one or more taught examples, kept as normalised feature sequences
(``normalise.features``). A query is compared with every example (``dtw.dtw_many``); a gloss's distance is its
nearest example's. The answer is the nearest gloss, with

- ``confidence`` = 1 - d1 / d2 (d1 the nearest gloss's distance, d2 the next gloss's): 0 when two glosses are
  equally near, near 1 when one is much nearer than any other (1 with a one-gloss vocabulary inside its radius);
- "unknown" when d1 is beyond the vocabulary's radius (the query is like nothing taught) or the confidence is
  below ``min_confidence`` (it is between two glosses).

The radius is calibrated from the vocabulary itself: ``radius_factor`` x the median distance between an example and
its gloss's nearest other example (how far apart two performances of one sign are; among at most 16 others, so
calibration is bounded: ``CALIBRATION_PEERS``); with one example per gloss
there is nothing to calibrate from and ``default_radius`` (calibrated on the synthetic set, bench/signs.py) is used.

This is isolated recognition: one sign (or word) per query. A trained model would replace this class (or the
extractor behind ``landmarks.LandmarkExtractor``) and keep the ``Recognition`` it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .dtw import dtw_many
from .landmarks import LandmarkSeq
from .normalise import LENGTH, features

UNKNOWN = "unknown"


@dataclass(frozen=True)
class RecogniserPolicy:
    band: int = 8  # DTW band radius in resampled frames (of LENGTH)
    radius_factor: float = 2.5
    default_radius: float = 0.75
    min_radius: float = 0.3
    min_confidence: float = 0.08


@dataclass(frozen=True)
class Recognition:
    gloss: str  # UNKNOWN when rejected
    confidence: float
    distance: float
    nearest: str  # the nearest gloss even when the answer is UNKNOWN ("" with an empty vocabulary)
    radius: float
    candidates: tuple[tuple[str, float], ...] = field(default=())  # (gloss, distance), nearest first, at most 5

    @property
    def known(self) -> bool:
        return self.gloss != UNKNOWN


@dataclass(frozen=True)
class Example:
    gloss: str
    features: np.ndarray  # LENGTH x F


CALIBRATION_PEERS = 16  # an example is compared with at most this many earlier examples of its gloss


class Recogniser:
    """Built once from examples in the order they were taught, then grown one example at a time (``with_example``):
    calibration compares each new example with at most CALIBRATION_PEERS earlier examples of its gloss, so teaching
    an example costs at most 16 DTW comparisons whatever the vocabulary's size, and a vocabulary built at once gives
    the same radius as the one grown example by example (up to 17 examples per gloss, every pair is compared)."""

    def __init__(self, kind: str, examples: Sequence[Example], policy: RecogniserPolicy | None = None) -> None:
        self.kind = kind
        self.policy = policy or RecogniserPolicy()
        self.examples = list(examples)
        self._glosses = [e.gloss for e in self.examples]
        self._stack = (np.stack([e.features for e in self.examples]) if self.examples
                       else np.zeros((0, LENGTH, 1), np.float32))
        self._spreads = np.full(len(self.examples), np.inf)  # each example's distance to its gloss's nearest other
        self._by_gloss: dict[str, list[int]] = {}
        for i in range(len(self.examples)):
            self._calibrate_one(i)
        self.radius = self._radius()

    @staticmethod
    def teach(kind: str, taught: Sequence[tuple[str, LandmarkSeq]], policy: RecogniserPolicy | None = None
              ) -> Recogniser:
        return Recogniser(kind, [Example(g, features(s, kind)) for g, s in taught], policy)

    def with_example(self, example: Example) -> Recogniser:
        """This recogniser with one more example (taught last): its calibration only is computed."""
        grown = Recogniser.__new__(Recogniser)
        grown.kind, grown.policy = self.kind, self.policy
        grown.examples = [*self.examples, example]
        grown._glosses = [*self._glosses, example.gloss]
        grown._stack = (np.concatenate([self._stack, example.features[None]]) if self.examples
                        else example.features[None].copy())
        grown._spreads = np.append(self._spreads, np.inf)
        grown._by_gloss = {g: list(ids) for g, ids in self._by_gloss.items()}
        grown._calibrate_one(len(grown.examples) - 1)
        grown.radius = grown._radius()
        return grown

    @property
    def glosses(self) -> list[str]:
        return sorted(set(self._glosses))

    def _calibrate_one(self, i: int) -> None:
        """Example ``i`` against at most CALIBRATION_PEERS earlier examples of its gloss; both sides' spreads."""
        earlier = self._by_gloss.setdefault(self._glosses[i], [])
        peers = earlier[-CALIBRATION_PEERS:]
        if peers:
            d = dtw_many(self._stack[i], self._stack[peers], self.policy.band)
            self._spreads[i] = float(d.min())
            for j, dj in zip(peers, d, strict=True):
                self._spreads[j] = min(self._spreads[j], float(dj))
        earlier.append(i)

    def _radius(self) -> float:
        p = self.policy
        spreads = self._spreads[np.isfinite(self._spreads)]
        if not len(spreads):
            return p.default_radius
        return max(p.min_radius, p.radius_factor * float(np.median(spreads)))

    def distances(self, query: np.ndarray) -> dict[str, float]:
        """Each gloss's distance to ``query`` (features): its nearest example's normalised DTW cost."""
        d = dtw_many(query, self._stack, self.policy.band)
        best: dict[str, float] = {}
        for gloss, dist in zip(self._glosses, d, strict=True):
            if dist < best.get(gloss, np.inf):
                best[gloss] = float(dist)
        return best

    def recognise(self, seq: LandmarkSeq) -> Recognition:
        return self.recognise_features(features(seq, self.kind))

    def recognise_features(self, query: np.ndarray) -> Recognition:
        ranked = sorted(self.distances(query).items(), key=lambda kv: kv[1])
        if not ranked:
            return Recognition(UNKNOWN, 0.0, float("inf"), "", self.radius)
        nearest, d1 = ranked[0]
        d2 = ranked[1][1] if len(ranked) > 1 else float("inf")
        confidence = 1.0 - d1 / d2 if np.isfinite(d2) and d2 > 0 else (1.0 if d1 <= self.radius else 0.0)
        confidence = float(np.clip(confidence, 0.0, 1.0))
        known = d1 <= self.radius and confidence >= self.policy.min_confidence
        return Recognition(nearest if known else UNKNOWN, round(confidence, 4), round(d1, 4), nearest,
                           round(self.radius, 4), tuple((g, round(d, 4)) for g, d in ranked[:5]))
