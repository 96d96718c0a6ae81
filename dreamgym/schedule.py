"""The sim-to-real schedule of ``dreamgym train``: where each iteration trains and when the loop stops.

The paper's modes are one loop with another environment per iteration:

- ``synthetic`` (DreamGym): every iteration trains in the experience model;
- ``real`` (the GRPO baseline): every iteration trains in the real environment;
- ``s2r`` (DreamGym-S2R): the first ``synthetic_iterations`` train in synthesis, the rest in the real
  environment, within ``real_budget`` real transitions.

Rollout *phases* say which environment and which policy a batch of episodes uses: the two training phases
above, plus ``eval`` (the policy on held-out real tasks) and ``random`` (the random-valid-action baseline on
the same tasks), both in the evaluation environment (``train.eval.env``, by default ``env``). Everything
here is plain Python, so the schedule is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dreamgym.config import TrainConfig
    from dreamgym.types import Task

TrainingPhase = Literal["synthetic", "real"]
RolloutPhase = Literal["synthetic", "real", "eval", "random"]


@dataclass(frozen=True)
class RolloutPlan:
    """What a rollout phase runs on: the environment kind and the acting policy."""

    env: Literal["synthetic", "real", "eval"]
    """``synthetic``: the experience model; ``real``: the real environment; ``eval``: the real environment of
    evaluation (``train.eval.env``, else ``env``)."""
    policy: Literal["policy", "random"]
    """``policy``: the policy engines; ``random``: a uniformly random admissible action."""


ROLLOUT_PLANS: dict[str, RolloutPlan] = {
    "synthetic": RolloutPlan("synthetic", "policy"),
    "real": RolloutPlan("real", "policy"),
    "eval": RolloutPlan("eval", "policy"),
    "random": RolloutPlan("eval", "random"),
}


def steps_learner(train: TrainConfig) -> bool:
    """Whether the learner takes a step in the run: an iteration or a warm start (``train.warm_start``). A run that
    only evaluates the initial policy (``train.iterations 0`` without a warm start: the study's ``base`` arm) has no
    learner actor (``dreamgym.placement.plan_placement``): it would load the model and never step."""
    return train.iterations > 0 or train.warm_start.method != "none"


def uses_replay(train: TrainConfig) -> bool:
    """Whether the run opens the replay buffer: its iterations write transitions (and synthetic ones retrieve them),
    or ``train.seed_replay`` fills it with the offline data. A run with neither (the study's ``base`` and ``bc``
    arms) starts no replay shard."""
    return train.iterations > 0 or train.seed_replay


def rollout_plan(phase: str) -> RolloutPlan:
    """The environment and policy of ``phase``; an unknown phase is an error naming the valid ones."""
    try:
        return ROLLOUT_PLANS[phase]
    except KeyError:
        raise ValueError(f"unknown rollout phase {phase!r}; expected one of {', '.join(ROLLOUT_PLANS)}") from None


@dataclass(frozen=True)
class Schedule:
    """Where iteration ``t`` trains, and whether iteration ``t`` may still start."""

    mode: Literal["synthetic", "real", "s2r"]
    iterations: int
    synthetic_iterations: int = 0
    real_budget: int | None = None

    @classmethod
    def from_config(cls, train: TrainConfig) -> Schedule:
        return cls(train.mode, train.iterations, train.synthetic_iterations, train.real_budget)

    def phase(self, iteration: int) -> TrainingPhase:
        """``synthetic`` or ``real``: where iteration ``iteration`` (0-based) trains."""
        if self.mode == "s2r":
            return "synthetic" if iteration < self.synthetic_iterations else "real"
        return self.mode

    @property
    def uses_synthetic(self) -> bool:
        """Whether any iteration trains in synthesis (the run needs an experience model)."""
        return self.mode == "synthetic" or (self.mode == "s2r" and self.synthetic_iterations > 0)

    @property
    def uses_real_training(self) -> bool:
        """Whether any iteration trains in the real environment. When none does (``synthetic``), training
        never opens the real environment: tasks, initial states and valid actions come from offline data."""
        return self.mode == "real" or (self.mode == "s2r" and self.iterations > self.synthetic_iterations)

    def budget_left(self, real_transitions: int) -> bool:
        """Whether the training rollouts may still spend real transitions."""
        return self.real_budget is None or real_transitions < self.real_budget

    def can_launch(self, iteration: int, real_transitions: int) -> bool:
        """Whether iteration ``iteration`` starts: within ``iterations``, and a real one only within the budget."""
        if iteration >= self.iterations:
            return False
        return self.phase(iteration) != "real" or self.budget_left(real_transitions)

    @staticmethod
    def trainable_tasks(tasks: Sequence[Task], phase: TrainingPhase) -> tuple[list[Task], int]:
        """The tasks ``phase`` can train on, and how many were left out: text-only task variants (written by
        the curriculum's generator, ``kind == "llm"``) have no real game of their own, so they train in
        synthesis only."""
        if phase == "synthetic":
            return list(tasks), 0
        kept = [t for t in tasks if t.kind != "llm"]
        return kept, len(tasks) - len(kept)
