"""The shapes of ``linguafusion eval``'s JSON: each path's scores, the degradation studies, the report."""

from __future__ import annotations

from typing import NotRequired, TypedDict, TypeGuard


class Score(TypedDict):
    """A sacrebleu corpus score with its signature."""

    score: float
    signature: str


class LatencyMs(TypedDict):
    p50: float
    p90: float
    mean: float


class Output(TypedDict):
    id: str
    source: str
    translation: str


class PathResult(TypedDict):
    """One modality path's scores (``evaluate``'s ``paths[name]``), in the report's key order."""

    items: int
    bleu: Score
    chrf: Score
    latency_ms: LatencyMs
    cer: NotRequired[float]  # slides
    wer: NotRequired[float]
    joint: NotRequired[float]
    outputs: NotRequired[list[Output]]


class EvalError(TypedDict):
    id: str
    path: str
    code: str
    message: str


class EvalResults(TypedDict):
    paths: dict[str, PathResult]
    errors: list[EvalError]


class StudyRow(TypedDict):
    level: float
    bleu: float
    chrf: float
    wer: float
    joint: float


class Knee(TypedDict):
    from_level: float
    to_level: float
    joint_drop: float
    confidence: float
    bootstrap_samples: int


class StudySkipped(TypedDict):
    study: str
    skipped: str


class StudyResult(TypedDict):
    study: str
    path: str
    axis: str
    a: float
    seed: int
    rows: list[StudyRow]
    knee: Knee


def is_study(study: StudyResult | StudySkipped) -> TypeGuard[StudyResult]:
    """A study that ran (one skipped for want of items has no rows)."""
    return "rows" in study
