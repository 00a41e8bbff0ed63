"""An online speaker clusterer: voice embeddings in, stable labels ("S1", "S2", ... in order of appearance) out.

Pure (numpy only, no model, no clock), so it is tested on hand-made vectors. Each speaker is a centroid: the
duration-weighted mean of the unit embeddings assigned to it. An embedding joins the most similar centroid
(cosine) when that similarity reaches ``threshold``; otherwise it opens a new speaker, unless ``max_speakers``
are already open, when it joins the most similar one anyway (and its confidence says so).

The confidence of an assignment is how clearly it beat the alternative: the logistic of (similarity to the chosen
speaker - the best other choice) / ``CONFIDENCE_SCALE``, where the other choice is the runner-up speaker, or the
threshold itself while a new speaker could still be opened (an embedding just over the threshold is as unsure
as one just under it; past the speaker cap, an embedding under the threshold is below 0.5: it matched nobody).
0.5 is a coin toss; a margin of 0.1 gives 0.88.

A file is clustered in two passes (``label_all``): online in time order, which finds the speakers, then each
embedding scored again against the final centroids (``score``) without moving them, so the first segments, which
opened the speakers on little evidence, are judged like the rest. Speakers that end up closer than the threshold
are merged before the second pass (``merge_close``): one voice split by an odd first segment.

Weights are seconds of voice. A short stretch's embedding is noisier (0.4 s of one voice against its other
0.4 s stretches: cosine 0.6-0.85, against another voice 0.35-0.5; whole sentences: 0.86-0.92 and up to 0.75), so
with ``slack`` the bar to join a speaker is lowered for stretches shorter than ``FULL_S``:
``threshold - slack * (1 - seconds / FULL_S)``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

CONFIDENCE_SCALE = 0.05
DEFAULT_THRESHOLD = 0.80  # bench/diarize.py: same voice 0.86-0.92 across texts, espeak male vs female ~0.75
MAX_SPEAKERS = 8
FULL_S = 1.6  # one encoder window: a stretch this long is judged at the full threshold
SHORT_SLACK = 0.25


class ClustererState(TypedDict):
    """``OnlineClusterer.state()``: the speakers' weighted sums (float16, base64), their dimension and weights."""
    dim: int
    weights: list[float]
    sums: str


@dataclass(frozen=True)
class Assignment:
    """One embedding's speaker: its index (0-based, in order of appearance), label and confidence (0..1)."""

    index: int
    confidence: float
    similarity: float  # cosine similarity to the speaker's centroid
    new: bool = False  # this embedding opened the speaker

    @property
    def label(self) -> str:
        return label(self.index)


def label(index: int) -> str:
    return f"S{index + 1}"


def confidence(best: float, alternative: float) -> float:
    return round(1.0 / (1.0 + math.exp(-(best - alternative) / CONFIDENCE_SCALE)), 3)


def _unit(v: np.ndarray) -> np.ndarray | None:
    norm = float(np.linalg.norm(v))
    return None if norm < 1e-8 else (v / norm).astype(np.float32)


@dataclass
class SpeakerClusterer:
    threshold: float = DEFAULT_THRESHOLD
    max_speakers: int = MAX_SPEAKERS
    slack: float = 0.0  # how much lower the bar is for a stretch much shorter than FULL_S (module docstring)
    _sums: list[np.ndarray] = field(default_factory=list)  # weighted sums of member unit embeddings
    _weights: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError("threshold is a cosine similarity: -1 to 1")
        if self.max_speakers < 1:
            raise ValueError("max_speakers must be at least 1")

    @property
    def speakers(self) -> int:
        return len(self._sums)

    def centroids(self) -> np.ndarray:
        """(speakers, dim) unit centroids."""
        if not self._sums:
            return np.zeros((0, 0), np.float32)
        return np.stack([s / max(1e-8, float(np.linalg.norm(s))) for s in self._sums]).astype(np.float32)

    def assign(self, embedding: np.ndarray, weight: float = 1.0) -> Assignment | None:
        """Online: ``embedding``'s speaker, the centroid moved towards it. None for an embedding with no
        direction (silence): it is nobody's."""
        unit = _unit(np.asarray(embedding, np.float32))
        if unit is None:
            return None
        bar = self.bar(weight)
        if not self._sums:
            return self._open(unit, weight, alternative=bar)
        sims = self.centroids() @ unit
        best = int(np.argmax(sims))
        can_open = self.speakers < self.max_speakers
        if sims[best] < bar and can_open:
            return self._open(unit, weight, alternative=float(sims[best]))
        self._sums[best] = self._sums[best] + weight * unit
        self._weights[best] += weight
        return Assignment(best, self._confidence(sims, best, can_open, bar), float(sims[best]))

    def bar(self, weight: float) -> float:
        """The similarity a stretch of ``weight`` seconds needs to join a speaker."""
        return self.threshold - self.slack * max(0.0, 1.0 - weight / FULL_S)

    def score(self, embedding: np.ndarray, weight: float = FULL_S) -> Assignment | None:
        """``embedding``'s nearest speaker now, the centroids left as they are (the second pass)."""
        unit = _unit(np.asarray(embedding, np.float32))
        if unit is None or not self._sums:
            return None
        sims = self.centroids() @ unit
        best = int(np.argmax(sims))
        return Assignment(best, self._confidence(sims, best, False, self.bar(weight)), float(sims[best]))

    def merge_close(self) -> None:
        """Merge the closest pair of speakers while it is within the threshold (agglomerative, on centroids)."""
        while self.speakers > 1:
            c = self.centroids()
            sims = c @ c.T
            np.fill_diagonal(sims, -2.0)
            a, b = np.unravel_index(int(np.argmax(sims)), sims.shape)
            if sims[a, b] < self.threshold:
                return
            keep, drop = min(int(a), int(b)), max(int(a), int(b))
            self._sums[keep] = self._sums[keep] + self._sums.pop(drop)
            self._weights[keep] += self._weights.pop(drop)

    def state(self) -> ClustererState:
        """What a stream's snapshot keeps of it (stream/speakers.py): each speaker's weighted sum as float16 (512
        bytes a speaker, base64) and its weight; ``restore`` reads it back."""
        sums = np.stack(self._sums).astype(np.float16) if self._sums else np.zeros((0, 0), np.float16)
        return {"dim": int(sums.shape[1]) if len(sums) else 0, "weights": [round(w, 3) for w in self._weights],
                "sums": base64.b64encode(sums.tobytes()).decode("ascii")}

    def restore(self, state: Mapping[str, object]) -> None:
        """The speakers of ``state`` (``state()``'s form), at most ``max_speakers`` of them; a malformed state
        leaves the clusterer as it was (the labels then start again: the snapshot is only a convenience)."""
        try:
            stored_weights, stored_dim, stored_sums = state["weights"], state["dim"], state["sums"]
            if not isinstance(stored_weights, list) or not isinstance(stored_dim, (int, float, str)) \
                    or not isinstance(stored_sums, (str, bytes)):
                return
            weights = [float(w) for w in stored_weights][:self.max_speakers]
            dim = int(stored_dim)
            raw = np.frombuffer(base64.b64decode(stored_sums), np.float16).astype(np.float32)
            sums = raw.reshape(-1, dim)[:len(weights)] if dim else raw.reshape(0, 0)
        except (KeyError, TypeError, ValueError):
            return
        if len(sums) != len(weights) or not np.isfinite(sums).all():
            return
        self._sums, self._weights = list(sums), weights

    def _open(self, unit: np.ndarray, weight: float, alternative: float) -> Assignment:
        self._sums.append(weight * unit)
        self._weights.append(weight)
        return Assignment(self.speakers - 1, confidence(1.0, alternative), 1.0, new=True)

    def _confidence(self, sims: np.ndarray, best: int, can_open: bool, bar: float | None = None) -> float:
        others = [float(s) for i, s in enumerate(sims) if i != best]
        bar = self.threshold if bar is None else bar
        # "a new speaker" (or, past the cap, "none of them") is the alternative while the best is not clear of it
        alternative = max([*others, bar] if can_open or sims[best] < bar else others or [bar])
        return confidence(float(sims[best]), alternative)


def label_all(embeddings: list[np.ndarray | None], weights: list[float], *, threshold: float = DEFAULT_THRESHOLD,
              max_speakers: int = MAX_SPEAKERS, min_weight: float = 0.0,
              slack: float = 0.0) -> list[Assignment | None]:
    """Each embedding's speaker (None for one with no direction), in two passes (module docstring); speaker
    indices renumbered in order of first appearance. The first pass takes embeddings of at least ``min_weight``
    (seconds of voice) first, then the shorter ones: the speakers are found on the most voice, and a short stretch
    ("Yes.") joins one of them before it opens a speaker of its own."""
    clusterer = SpeakerClusterer(threshold=threshold, max_speakers=max_speakers, slack=slack)
    order_in = sorted(range(len(embeddings)), key=lambda i: (weights[i] < min_weight, i))
    for i in order_in:
        if embeddings[i] is not None:
            clusterer.assign(embeddings[i], weights[i])  # type: ignore[arg-type]
    clusterer.merge_close()
    scored = [None if emb is None else clusterer.score(emb, w) for emb, w in zip(embeddings, weights, strict=True)]
    order: dict[int, int] = {}
    for a in scored:
        if a is not None:
            order.setdefault(a.index, len(order))
    return [None if a is None else Assignment(order[a.index], a.confidence, a.similarity) for a in scored]
