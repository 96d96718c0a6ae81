"""Invalid-transition accounting: how many queries, model calls, retries and invalid transitions,
and why replies were malformed. Merged across replicas/environments with ``+=``; what one stretch of
work spent is ``after - before`` (``copy()`` the tally before it). The counters are the integer fields
of ``InvalidAccounting``, listed once, in the class (``COUNTERS``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class InvalidAccounting:
    queries: int = 0
    """Steps asked of the experience model (including settled ones)."""
    model_calls: int = 0
    """Generations sent to a backend (first attempts + retries)."""
    retries: int = 0
    valid: int = 0
    invalid: int = 0
    """Queries whose every attempt was malformed: invalid transitions, never valid for the learner."""
    recovered: int = 0
    """Queries that were malformed at first and valid after a retry."""
    settled: int = 0
    """Inadmissible actions settled by the environment's admissible list (no model call)."""
    reasons: Counter[str] = field(default_factory=Counter)
    """Malformed-reply reasons over all attempts (``missing:<reward>``, ``reward:out-of-range``...)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def invalid_rate(self) -> float:
        return self.invalid / self.queries if self.queries else 0.0

    def counts(self) -> dict[str, int]:
        """The counters by name (every field but ``reasons``), in declaration order."""
        return {name: getattr(self, name) for name in COUNTERS}

    def copy(self) -> InvalidAccounting:
        return InvalidAccounting(**self.counts(), reasons=Counter(self.reasons))

    def __iadd__(self, other: InvalidAccounting) -> InvalidAccounting:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reasons.update(other.reasons)
        return self

    def __sub__(self, before: InvalidAccounting) -> InvalidAccounting:
        """What was counted since ``before`` (an earlier ``copy()`` of this tally)."""
        reasons = Counter(self.reasons)
        reasons.subtract(before.reasons)
        return InvalidAccounting(**{name: getattr(self, name) - getattr(before, name) for name in COUNTERS},
                                 reasons=+reasons)

    def as_dict(self) -> dict[str, Any]:
        return {**self.counts(), "invalid_rate": round(self.invalid_rate, 4),
                "reasons": dict(self.reasons.most_common())}


#: The integer counters of ``InvalidAccounting`` (all its fields but the ``reasons`` counter).
COUNTERS: tuple[str, ...] = tuple(f.name for f in fields(InvalidAccounting) if f.name != "reasons")
