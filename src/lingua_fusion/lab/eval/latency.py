"""Simultaneous-translation latency as the field measures it (SimulEval's definitions, speech input).

``delays[i]`` is how much source audio (ms) had been read when target word i was emitted. With our captions every
word of a final is emitted at once, so each word of final k gets ``(end_k + latency_k) * 1000`` when
computation-aware (the caption's wall-clock lag included) or ``end_k * 1000`` when not.

AL   (Ma et al., 2019):  1/tau * sum_{i<=tau} (d_i - (i-1) * |X| / |Y|),  tau = first i with d_i >= |X|
LAAL (Papi et al., 2022): AL with |Y| replaced by max(|Y|, |Y*|) (hypothesis or reference length)
EndOffset: d_last - |X|, how long after the source ended the last word came.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def _al(delays: list[float], source_ms: float, target_len: int) -> float:
    if not delays:
        return float("nan")
    if delays[0] > source_ms:
        return delays[0]
    gamma = target_len / source_ms
    total = 0.0
    tau = 0
    for i, d in enumerate(delays):
        if d > source_ms:
            break
        total += d - i / gamma
        tau = i + 1
        if d >= source_ms:
            break
    return total / tau


def average_lagging(delays: list[float], source_ms: float) -> float:
    return _al(delays, source_ms, len(delays))


def length_adaptive_average_lagging(delays: list[float], source_ms: float, reference_len: int) -> float:
    return _al(delays, source_ms, max(len(delays), reference_len))


def end_offset(delays: list[float], source_ms: float) -> float:
    return delays[-1] - source_ms if delays else float("nan")


def _number(value: object) -> int | float | str:
    """An event's number for ``float()`` (anything else is the TypeError ``float()`` would raise)."""
    if isinstance(value, (int, float, str)):
        return value
    raise TypeError(f"not a number: {value!r}")


def delays_from_finals(finals: Iterable[Mapping[str, object]], *, computation_aware: bool = True) -> list[float]:
    """One delay per target word, from final caption events (``end`` s, ``latency_s`` or latency_ms.caption)."""
    delays: list[float] = []
    for f in finals:
        words = str(f.get("text") or "").split()
        lag = 0.0
        if computation_aware:
            latency_s, latency_ms = f.get("latency_s"), f.get("latency_ms")
            if latency_s is not None:
                lag = float(_number(latency_s))
            elif isinstance(latency_ms, Mapping) and "caption" in latency_ms:
                lag = float(_number(latency_ms["caption"])) / 1000
        delays += [(float(_number(f["end"])) + lag) * 1000] * len(words)
    return delays


def summarize(finals: Sequence[Mapping[str, object]], source_s: float,
              reference: str | None = None) -> dict[str, float]:
    ref_len = len(reference.split()) if reference else 0
    out: dict[str, float] = {}
    for name, ca in (("", False), ("_ca", True)):
        d = delays_from_finals(finals, computation_aware=ca)
        out["AL" + name] = round(average_lagging(d, source_s * 1000), 1)
        out["LAAL" + name] = round(length_adaptive_average_lagging(d, source_s * 1000, ref_len), 1)
        out["EndOffset" + name] = round(end_offset(d, source_s * 1000), 1)
    return out
