"""The retry policy for malformed replies: bounded attempts, each with a documented change of sampling.

Attempt 1 uses the configured sampling. After a malformed reply, the next attempt changes it so it is
not likely to fail the same way (no per-request seed is involved; vLLM's CPU sampler crashes on one):

1. the reply was cut by the token limit (``finish_reason == "length"``): ``max_tokens`` is multiplied by
   ``max_tokens_growth`` (up to ``max_tokens_cap``); the temperature is kept;
2. else, with a temperature above 0: the temperature is multiplied by ``temperature_decay`` (a sharper
   distribution makes format slips rarer); below ``0.05`` it becomes 0 (greedy);
3. else (greedy, which would repeat the same reply): the temperature becomes ``escape_temperature``.

After ``max_attempts`` malformed replies the transition is *invalid*: counted, flagged, and never
given to the learner as valid. A reply the backend refused (``finish_reason`` ``error:...``, e.g. a
prompt longer than the context) is not retried: the same prompt would be refused again.
"""

from __future__ import annotations

from dataclasses import dataclass

from dreamgym.experience.schema import Completion, Sampling


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    temperature_decay: float = 0.5
    escape_temperature: float = 0.7
    max_tokens_growth: float = 2.0
    max_tokens_cap: int = 1024

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")

    def should_retry(self, attempt: int, failed: Completion) -> bool:
        """Whether a malformed reply at 1-based ``attempt`` gets another try."""
        return attempt < self.max_attempts and not failed.finish_reason.startswith("error")

    def next_sampling(self, prev: Sampling, failed: Completion) -> Sampling:
        """The sampling of the next attempt after ``failed`` (rules 1-3 of the module docstring)."""
        if failed.finish_reason == "length" and prev.max_tokens < self.max_tokens_cap:
            grown = min(int(prev.max_tokens * self.max_tokens_growth), self.max_tokens_cap)
            return prev.with_(max_tokens=max(grown, prev.max_tokens + 1))
        if prev.temperature > 0:
            t = prev.temperature * self.temperature_decay
            return prev.with_(temperature=t if t >= 0.05 else 0.0)
        return prev.with_(temperature=self.escape_temperature)

    def schedule(self, first: Sampling, failures: list[Completion]) -> list[Sampling]:
        """The samplings used for a sequence of failures (for documentation and tests)."""
        out = [first]
        for f in failures[: self.max_attempts - 1]:
            out.append(self.next_sampling(out[-1], f))
        return out
