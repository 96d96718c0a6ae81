"""The simulator guard: stop training when the experience model goes bad.

A synthetic environment can fail quietly: an LLM simulator that starts returning empty or malformed
replies, or one whose rewards collapse (paid on every episode, or never), still yields episodes, and a
learner trained on them gets worse while every loss curve looks normal. The guard keeps the counters of
the last ``train.guard.window`` synthetic iterations and, once the window holds ``min_steps`` synthetic
steps, compares

- the invalid-transition rate (invalid steps / synthetic steps),
- the synthetic reward rate (valid episodes paid a positive reward / valid episodes),
- the reward/success agreement (valid episodes whose reward agrees with their success / valid episodes)

with the configured thresholds. ``observe`` returns the verdict; the driver stops the run on a trip.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dreamgym.config import GuardConfig
from dreamgym.errors import DreamGymError


class SimulatorCollapsedError(DreamGymError):
    """The guard saw the experience model's replies or rewards go past a threshold; training stopped."""


@dataclass
class WindowCounts:
    """Synthetic counters of one iteration (or a window of them, added up)."""

    steps: int = 0
    invalid_transitions: int = 0
    valid_episodes: int = 0
    paid_episodes: int = 0
    """Valid episodes with a positive total reward."""
    agreeing_episodes: int = 0

    def __add__(self, other: WindowCounts) -> WindowCounts:
        return WindowCounts(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[int, ...]:
        return (self.steps, self.invalid_transitions, self.valid_episodes, self.paid_episodes,
                self.agreeing_episodes)

    @property
    def invalid_rate(self) -> float:
        return self.invalid_transitions / self.steps if self.steps else 0.0

    @property
    def reward_rate(self) -> float:
        return self.paid_episodes / self.valid_episodes if self.valid_episodes else 0.0

    @property
    def outcome_agreement(self) -> float:
        return self.agreeing_episodes / self.valid_episodes if self.valid_episodes else 1.0


@dataclass
class Verdict:
    tripped: bool
    reasons: list[str]
    window: WindowCounts
    iterations: int
    """Synthetic iterations in the window."""

    def to_dict(self) -> dict[str, Any]:
        w = self.window
        return {"tripped": self.tripped, "reasons": self.reasons, "iterations": self.iterations,
                "steps": w.steps, "invalid_rate": w.invalid_rate, "reward_rate": w.reward_rate,
                "outcome_agreement": w.outcome_agreement, "valid_episodes": w.valid_episodes}

    def message(self) -> str:
        w = self.window
        return (f"simulator guard stopped training: {'; '.join(self.reasons)} over the last {self.iterations} "
                f"synthetic iteration(s) ({w.steps} steps, {w.valid_episodes} valid episodes). The experience "
                "model's replies are not fit to train on: check its endpoint or replicas and `em_reason:*` counts "
                "in metrics.jsonl, then resume with `dreamgym train --resume RUN_DIR` (thresholds: train.guard).")


@dataclass
class SimulatorGuard:
    cfg: GuardConfig
    _window: deque[WindowCounts] = field(default_factory=deque)

    def observe(self, stats: dict[str, Any]) -> Verdict:
        """Add one synthetic iteration's rollout stats (``RolloutStats.as_dict``) and judge the window."""
        valid = int(stats["episodes"]) - int(stats["invalid_episodes"])
        self._window.append(WindowCounts(
            steps=int(stats["steps"]), invalid_transitions=int(stats["invalid_transitions"]), valid_episodes=valid,
            paid_episodes=int(stats.get("paid_episodes", 0)), agreeing_episodes=int(stats["outcome_agreements"])))
        while len(self._window) > self.cfg.window:
            self._window.popleft()
        total = sum(self._window, WindowCounts())
        return Verdict(bool(self.cfg.enabled and total.steps >= self.cfg.min_steps and self._reasons(total)),
                       self._reasons(total), total, len(self._window))

    def _reasons(self, w: WindowCounts) -> list[str]:
        c, out = self.cfg, []
        if w.invalid_rate > c.max_invalid_rate:
            out.append(f"invalid transitions {w.invalid_rate:.0%} > train.guard.max_invalid_rate "
                       f"{c.max_invalid_rate:.0%}")
        if w.valid_episodes:
            if w.reward_rate < c.min_reward_rate:
                out.append(f"reward rate {w.reward_rate:.0%} < train.guard.min_reward_rate {c.min_reward_rate:.0%}")
            if w.reward_rate > c.max_reward_rate:
                out.append(f"reward rate {w.reward_rate:.0%} > train.guard.max_reward_rate {c.max_reward_rate:.0%}")
            if w.outcome_agreement < c.min_outcome_agreement:
                out.append(f"reward/success agreement {w.outcome_agreement:.0%} < "
                           f"train.guard.min_outcome_agreement {c.min_outcome_agreement:.0%}")
        elif c.min_reward_rate > 0 or c.min_outcome_agreement > 0:
            out.append("no valid synthetic episode")
        return out


__all__ = ["SimulatorCollapsedError", "SimulatorGuard", "Verdict", "WindowCounts"]
