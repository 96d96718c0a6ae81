"""Invalid-transition accounting: how many queries, model calls, retries and invalid transitions,
and why replies were malformed. Merged across replicas/environments with ``+=``; what one stretch of
work spent is ``after - before`` (``copy()`` the tally before it). The counters are the integer fields
of ``InvalidAccounting``, listed once, in the class (``COUNTERS``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from dreamgym.experience.schema import Completion


def _ratio(a: float, b: float, digits: int = 3) -> float | None:
    """``a / b`` rounded to ``digits``, ``None`` with nothing to divide by."""
    return round(a / b, digits) if b else None


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
    unsettled: int = 0
    """Inadmissible actions the admissible list *would* have settled, sent to the model because settling is off
    (``experience_model.inadmissible: model``, the ``no-rules`` arm)."""
    rule_unenforced: int = 0
    """Replies accepted although they break the family's reward rule, because the check is off
    (``experience_model.check_reward_rule: false``): what the rule would have refused."""
    first_parsed: int = 0
    """Queries whose first reply parsed (the model's own answer, before retries and the reward rule)."""
    first_rule_ok: int = 0
    """Of ``first_parsed``: first replies that keep the reward rule (their reward agrees with done/success)."""
    first_final: int = 0
    """Queries with a parsed first reply and a valid final prediction (the pairs of ``first_final_agree``)."""
    first_final_agree: int = 0
    """Of ``first_final``: the first reply's reward equals the reward of the step's final prediction (after
    retries and rules). Below 1 means the rules changed the model's answer."""
    reasons: Counter[str] = field(default_factory=Counter)
    """Malformed-reply reasons over all attempts (``missing:<reward>``, ``reward:out-of-range``...)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Of ``prompt_tokens``: served by the engine's prefix cache (``Completion.cached_tokens``)."""
    engine_steps: int = 0
    """Engine ``step()`` calls booked on these calls' replies; with ``engine_running``, ``engine_waiting`` (requests
    run / left waiting, summed over the steps) and ``engine_us`` (their wall time): the batches the replicas ran
    (``Completion.engine_steps``; 0 from backends that do not say)."""
    engine_running: int = 0
    engine_waiting: int = 0
    engine_us: int = 0
    engine_prefill_steps: int = 0
    """Of ``engine_steps``: those that began with new requests (their prompts computed), and their wall time
    (``engine_prefill_us``): what the prompts cost beside the generated tokens."""
    engine_prefill_us: int = 0

    @property
    def invalid_rate(self) -> float:
        return self.invalid / self.queries if self.queries else 0.0

    def add_reply(self, reply: Completion) -> None:
        """Count one backend reply's tokens and the engine steps booked on it."""
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.cached_tokens += reply.cached_tokens
        self.engine_steps += reply.engine_steps
        self.engine_running += reply.engine_running
        self.engine_waiting += reply.engine_waiting
        self.engine_us += reply.engine_us
        self.engine_prefill_steps += reply.engine_prefill_steps
        self.engine_prefill_us += reply.engine_prefill_us

    def token_figures(self, transitions: int) -> dict[str, float | None]:
        """Where the experience model's tokens and time went (``None`` with nothing to divide by): per call, prompt,
        generated and prefix-cached tokens; calls per transition (``transitions``: synthetic steps, settled ones
        included) and per model-asked query (retries included); the engine's mean running and waiting requests
        per step, milliseconds per step and per generated token, and its busy seconds (summed over replicas), of
        which the steps that began with new requests (computing prompts) took ``prefill_busy_s``."""
        asked = self.queries - self.settled
        return {"calls": self.model_calls, "calls_per_transition": _ratio(self.model_calls, transitions),
                "calls_per_model_query": _ratio(self.model_calls, asked),
                "prompt_tokens_per_call": _ratio(self.prompt_tokens, self.model_calls, 1),
                "generated_tokens_per_call": _ratio(self.completion_tokens, self.model_calls, 1),
                "cached_tokens_per_call": _ratio(self.cached_tokens, self.model_calls, 1),
                "prefix_cache_hit_share": _ratio(self.cached_tokens, self.prompt_tokens),
                "engine_steps": self.engine_steps,
                "mean_running_per_step": _ratio(self.engine_running, self.engine_steps, 2),
                "mean_waiting_per_step": _ratio(self.engine_waiting, self.engine_steps, 2),
                "ms_per_step": _ratio(self.engine_us / 1000, self.engine_steps, 2),
                "ms_per_generated_token": _ratio(self.engine_us / 1000, self.completion_tokens, 2),
                "engine_busy_s": round(self.engine_us / 1e6, 2),
                "prefill_steps": self.engine_prefill_steps,
                "prefill_busy_s": round(self.engine_prefill_us / 1e6, 2),
                "ms_per_prefill_step": _ratio(self.engine_prefill_us / 1000, self.engine_prefill_steps, 2),
                "ms_per_other_step": _ratio((self.engine_us - self.engine_prefill_us) / 1000,
                                            self.engine_steps - self.engine_prefill_steps, 2)}

    def rule_shares(self) -> dict[str, float | None]:
        """What the rules did and what the model did alone (``None`` with nothing to count): the share of steps
        the admissible rule settled (or would have, when off), the share of first replies that keep the reward
        rule, and the share whose reward the final outcome kept."""
        return {"settled_share": _ratio(self.settled, self.queries, 4),
                "would_settle_share": _ratio(self.settled + self.unsettled, self.queries, 4),
                "first_reply_rule_agreement": _ratio(self.first_rule_ok, self.first_parsed, 4),
                "first_reply_final_agreement": _ratio(self.first_final_agree, self.first_final, 4)}

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


def counts_from(stats: dict[str, Any], prefix: str = "em_") -> InvalidAccounting:
    """The tally in a rollout-stats dict whose counters carry ``prefix`` (the rollout workers' ``em_<counter>``)."""
    return InvalidAccounting(**{name: int(stats.get(prefix + name, 0)) for name in COUNTERS})


def rule_figures(iterations: list[dict[str, Any]]) -> dict[str, Any]:
    """Per synthetic iteration and over all of them, what the rules settled and how the model's first replies
    fared (``InvalidAccounting.rule_shares``), from ``metrics.jsonl`` iteration records (``rollout`` holds the
    ``em_*`` counters). For ``summary.json``."""
    total = InvalidAccounting()
    per = []
    for r in iterations:
        if r.get("phase") != "synthetic":
            continue
        c = counts_from(r.get("rollout") or {})
        total += c
        per.append({"iteration": r.get("iteration"), "queries": c.queries, **c.rule_shares()})
    return {"queries": total.queries, "settled": total.settled, "unsettled": total.unsettled,
            "rule_unenforced": total.rule_unenforced, **total.rule_shares(), "per_iteration": per}
