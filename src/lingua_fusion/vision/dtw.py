"""Dynamic time warping with a Sakoe-Chiba band (pure numpy).

``dtw(a, b, radius)`` aligns two feature sequences (n x F and m x F) under Euclidean frame distance, allowing each
to run faster or slower than the other but never jumping more than ``radius`` frames off the (rescaled) diagonal,
and returns the aligned cost divided by n + m (comparable across lengths). ``dtw_many`` does the same for one query
against N templates of one length at once: the recurrence's loop runs over the band's cells and each step is
vectorised over the templates, so a vocabulary of hundreds of examples costs a few milliseconds.
"""

from __future__ import annotations

import numpy as np


def frame_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances between each frame of ``a`` (n x F) and of each template in ``b`` (N x m x F):
    N x n x m (``b`` may also be m x F: n x m)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    aa = (a * a).sum(-1)
    bb = (b * b).sum(-1)
    cross = np.einsum("if,...jf->...ij", a, b)
    d2 = aa[:, None] + bb[..., None, :] - 2.0 * cross
    return np.sqrt(np.maximum(d2, 0.0))


def _band(i: int, n: int, m: int, radius: int) -> tuple[int, int]:
    centre = (i * (m - 1)) / (n - 1) if n > 1 else 0.0
    return max(0, int(np.ceil(centre - radius))), min(m - 1, int(np.floor(centre + radius)))


def _accumulate(cost: np.ndarray, radius: int) -> np.ndarray:
    """cost: N x n x m -> the accumulated cost at (n-1, m-1) for each of the N, inf if the band allows no path."""
    count, n, m = cost.shape
    inf = np.full(count, np.inf)
    prev = np.full((count, m), np.inf)
    for i in range(n):
        row = np.full((count, m), np.inf)
        lo, hi = _band(i, n, m, radius)
        for j in range(lo, hi + 1):
            if i == 0 and j == 0:
                best = np.zeros(count)
            else:
                best = np.minimum(prev[:, j], row[:, j - 1] if j > 0 else inf)
                if j > 0:
                    best = np.minimum(best, prev[:, j - 1])
            row[:, j] = cost[:, i, j] + best
        prev = row
    return prev[:, m - 1]


def dtw(a: np.ndarray, b: np.ndarray, radius: int | None = None) -> float:
    """Normalised DTW cost between ``a`` (n x F) and ``b`` (m x F); ``radius`` None: no band."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("dtw of an empty sequence")
    r = max(n, m) if radius is None else max(int(radius), 0 if n == m else 1)
    total = _accumulate(frame_distances(a, b)[None], r)[0]
    return float(total / (n + m))


def dtw_many(query: np.ndarray, templates: np.ndarray, radius: int | None = None) -> np.ndarray:
    """Normalised DTW cost between ``query`` (n x F) and each of ``templates`` (N x m x F): an array of N."""
    if templates.ndim != 3 or templates.shape[0] == 0:
        return np.zeros(0)
    n, m = len(query), templates.shape[1]
    r = max(n, m) if radius is None else max(int(radius), 0 if n == m else 1)
    return _accumulate(frame_distances(query, templates), r) / (n + m)
