"""Mean and 95% confidence interval over training seeds (Student's t, two-sided).

No scipy: the 0.975 quantile of Student's t comes from a table for 1-30 degrees of freedom and from the
Cornish-Fisher expansion beyond (error under 1e-4 there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: t_{0.975, df} for df = 1..30 (standard tables, 3 decimals).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (the 95% two-sided multiplier)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z, v = _Z975, float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values and its 95% t-interval; ``low``/``high`` are ``None`` with one value (no spread)."""

    n: int
    mean: float | None
    low: float | None
    high: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def clipped(self, lo: float = 0.0, hi: float = 1.0) -> Interval:
        """The interval cut to the range the quantity can take (a success rate: 0..1); a t-interval over few
        seeds can reach past it."""
        if self.low is None or self.high is None:
            return self
        return Interval(self.n, self.mean, max(lo, self.low), min(hi, self.high))

    def format(self, pct: bool = True) -> str:
        """``62.5% [51.0, 74.0]``; ``62.5% (95% CI n/a, 1 seed)``; ``-`` with no value."""
        if self.mean is None:
            return "-"
        f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.3g}")
        unit = "%" if pct else ""
        if self.low is None or self.high is None:
            return f"{f(self.mean)}{unit} (95% CI n/a, {self.n} seed)"
        return f"{f(self.mean)}{unit} [{f(self.low)}, {f(self.high)}]"


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval ``mean +- t_{0.975, n-1} * s / sqrt(n)`` (``s``: sample standard deviation)."""
    xs = [float(x) for x in values]
    n = len(xs)
    if n == 0:
        return Interval(0, None, None, None)
    mean = sum(xs) / n
    if n == 1:
        return Interval(1, mean, None, None)
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t975(n - 1) * s / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half)
