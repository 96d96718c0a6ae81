"""Invalid-transition accounting: how many queries, model calls, retries and invalid transitions,
and why replies were malformed. Merged across replicas/environments with ``+=``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
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

    def __iadd__(self, other: InvalidAccounting) -> InvalidAccounting:
        for name in ("queries", "model_calls", "retries", "valid", "invalid", "recovered", "settled",
                     "prompt_tokens", "completion_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reasons.update(other.reasons)
        return self

    def as_dict(self) -> dict[str, Any]:
        return {
            "queries": self.queries, "model_calls": self.model_calls, "retries": self.retries,
            "valid": self.valid, "invalid": self.invalid, "recovered": self.recovered, "settled": self.settled,
            "invalid_rate": round(self.invalid_rate, 4), "reasons": dict(self.reasons.most_common()),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
        }
