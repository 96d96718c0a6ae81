"""Task scores: the reward variance ``V_tau`` of a task's latest GRPO group, and the selection weight.

``V_tau = (1/n) sum_i (r_i - mean r)^2`` over the ``n`` rollouts of the latest group of task ``tau``
(the population variance, ``dreamgym.grpo.reward_variance``, whose square root is the ``std`` of GRPO's
advantages). For rewards in ``{0, 1}`` it equals ``p (1 - p)`` with ``p`` the group's success rate,
maximal (0.25) at a 50/50 split and 0 when the policy always or never succeeds: the tasks with the
largest ``V_tau`` are the ones where GRPO's group-relative advantages carry signal.

The selection weight of a task that has been tried (see ``TaskWeights``):

- stale scores decay: measured ``k`` iterations before the latest one, ``V_tau`` counts ``gamma**k``;
- a floor ``min_weight`` keeps tasks with ``V_tau = 0`` in the draw (the policy changes, a task it
  always solved may become informative again);
- **never-solved tasks** (tried in at least ``unsolved_after`` groups without one success) get
  ``min_weight * unsolved_weight``. Variance alone cannot rank them: ``V_tau = 0`` both for tasks
  that are too hard and for tasks already mastered, but only the mastered ones are cheap to keep
  sampling and only the too-hard ones make generation worse (a harder variant of an unsolvable task
  is useless). So they are down-weighted below every other tried task, never chosen as generation
  parents, and kept in the pool: one success on a later revisit clears the state.

Tasks that have never been tried have no weight: the selection explores them first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# ``V_tau`` is defined once, next to the GRPO advantages whose ``std`` is its square root.
from dreamgym.grpo import reward_variance as reward_variance


@dataclass(frozen=True)
class TaskWeights:
    """How scores become selection weights (the fields of ``CurriculumConfig`` of the same names)."""

    score_decay: float = 0.9
    """``gamma`` per iteration of staleness."""
    min_weight: float = 0.01
    """Floor of a tried task's weight."""
    unsolved_after: int = 3
    """Groups without a success after which a task counts as never solved."""
    unsolved_weight: float = 0.1
    """Multiplier on ``min_weight`` for never-solved tasks."""

    def decayed(self, variance: float, age: int) -> float:
        """``V_tau * gamma ** age`` where ``age`` counts iterations since the measurement was fresh."""
        return variance * self.score_decay ** max(0, age)

    def never_solved(self, groups: int, successes: int) -> bool:
        return groups >= self.unsolved_after and successes == 0

    def weight(self, variance: float, age: int, groups: int, successes: int) -> float:
        """The selection weight of a tried task (see the module docstring)."""
        if self.never_solved(groups, successes):
            return self.min_weight * self.unsolved_weight
        return max(self.decayed(variance, age), self.min_weight)


#: Bin edges of the ``V_tau`` histogram in the metrics (rewards in [0, 1] give ``V_tau <= 0.25``).
HISTOGRAM_EDGES = (0.0, 0.01, 0.05, 0.1, 0.15, 0.2, 0.25)


def variance_histogram(values: Sequence[float], edges: Sequence[float] = HISTOGRAM_EDGES) -> dict[str, int]:
    """Counts of ``values`` per bin ``[edges[i], edges[i+1])``; the last bin also holds everything above."""
    labels = [f"{edges[i]:g}-{edges[i + 1]:g}" for i in range(len(edges) - 1)]
    counts = dict.fromkeys(labels, 0)
    for v in values:
        i = len(labels) - 1
        for j in range(len(labels)):
            if v < edges[j + 1]:
                i = j
                break
        counts[labels[i]] += 1
    return counts
