"""A model's batch latency as a line, ``c0 + c1 * batch``, learned online from the batches it ran (pure): what the
scheduler sizes batches by and admission counts a batch runner's capacity with."""

from __future__ import annotations


class CostModel:
    """latency(b) ~ c0 + c1*b, fitted by exponentially weighted least squares over observed batches."""

    def __init__(self, c0: float = 0.2, c1: float = 0.1, decay: float = 0.95) -> None:
        self.c0, self.c1, self.decay = c0, c1, decay
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.observations = 0

    def predict(self, batch: int) -> float:
        return max(0.0, self.c0 + self.c1 * batch)

    def observe(self, batch: int, seconds: float) -> None:
        d = self.decay
        self._sw = d * self._sw + 1
        self._sx = d * self._sx + batch
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + batch * batch
        self._sxy = d * self._sxy + batch * seconds
        self.observations += 1
        var = self._sw * self._sxx - self._sx ** 2
        if var > 1e-9:
            c1 = (self._sw * self._sxy - self._sx * self._sy) / var
            c0 = (self._sy - c1 * self._sx) / self._sw
            if c1 >= 0 and c0 >= 0:
                self.c0, self.c1 = c0, c1
                return
        # one batch size seen so far (or a degenerate fit): keep the slope, move the intercept
        mean_b, mean_y = self._sx / self._sw, self._sy / self._sw
        self.c0 = max(0.0, mean_y - self.c1 * mean_b)

    def max_batch_within(self, seconds: float, cap: int) -> int:
        if self.c1 <= 0:
            return cap
        return max(1, min(cap, int((seconds - self.c0) / self.c1 + 1e-9)))
