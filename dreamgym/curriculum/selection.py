"""Selecting the next batch of tasks.

The strategy, in order (``B`` = batch size, ``lambda`` = ``generated_fraction``):

1. **Cap.** At most ``G = min(floor(lambda * B), B - min_seed_tasks)`` generated tasks may enter the
   batch. The cap is checked at every single pick, so no path below can break it; the rest of the
   batch is seed tasks, and seed tasks are never removed from the pool.
2. **Exploration.** Never-tried tasks come first, up to ``ceil(explore_fraction * B)`` of them (the
   whole batch while nothing has been tried yet): generated ones first (they were made for the
   current policy's frontier), then seed tasks, each in the order they entered the pool.
3. **Preference for high ``V_tau``.** The remaining slots are drawn from tried tasks by weight ``w``
   (``TaskWeights``: decayed ``V_tau`` with a floor, never-solved tasks down-weighted):
   ``proportional`` draws without replacement with probability proportional to ``w ** alpha``
   (Efraimidis-Spirakis keys ``u ** (1 / w**alpha)``, ``u ~ U(0, 1)``); ``top`` takes the highest
   ``w`` with a random tie-break. A generated task whose turn comes when the cap is full is skipped.
4. **Fill.** If tried tasks run out, the remaining never-tried tasks fill the batch. A batch is shorter
   than ``B`` only when the pool has too few tasks that the cap allows.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from dreamgym.curriculum.pool import TaskRecord


@dataclass(frozen=True)
class SelectionRule:
    """The selection knobs (the ``CurriculumConfig`` fields of the same names)."""

    generated_fraction: float = 0.25
    min_seed_tasks: int = 1
    explore_fraction: float = 0.5
    strategy: Literal["proportional", "top"] = "proportional"
    sharpness: float = 3.0

    def generated_cap(self, batch_size: int) -> int:
        """``G``: the most generated tasks a batch of ``batch_size`` may hold."""
        return max(0, min(math.floor(self.generated_fraction * batch_size + 1e-9), batch_size - self.min_seed_tasks))


def select_batch(
    records: Sequence[TaskRecord],
    batch_size: int,
    weight: Callable[[TaskRecord], float],
    rule: SelectionRule,
    rng: random.Random,
) -> list[TaskRecord]:
    """Pick up to ``batch_size`` distinct tasks from ``records`` (see the module docstring)."""
    cap = rule.generated_cap(batch_size)
    chosen: list[TaskRecord] = []
    taken: set[str] = set()
    n_generated = 0

    def take(r: TaskRecord) -> None:
        nonlocal n_generated
        if len(chosen) >= batch_size or r.task_id in taken or (r.generated and n_generated >= cap):
            return
        chosen.append(r)
        taken.add(r.task_id)
        n_generated += r.generated

    untried = [r for r in records if not r.tried]
    untried.sort(key=lambda r: not r.generated)  # stable: generated first, then pool order
    tried = [r for r in records if r.tried]
    n_explore = batch_size if not tried else math.ceil(rule.explore_fraction * batch_size)
    for r in untried:
        if len(chosen) >= n_explore:
            break
        take(r)

    for r in _ranked(tried, weight, rule, rng):
        if len(chosen) >= batch_size:
            break
        take(r)
    for r in untried:
        if len(chosen) >= batch_size:
            break
        take(r)
    return chosen


def _ranked(
    tried: Sequence[TaskRecord], weight: Callable[[TaskRecord], float], rule: SelectionRule, rng: random.Random
) -> list[TaskRecord]:
    """Tried tasks in the order the strategy would pick them."""
    keyed: list[tuple[float, float, int, TaskRecord]] = []
    for i, r in enumerate(tried):
        w = max(weight(r), 1e-12)
        u = rng.random()
        if rule.strategy == "top":
            keyed.append((w, u, -i, r))
        else:  # log of the Efraimidis-Spirakis key u ** (1 / w**alpha), larger first
            keyed.append((math.log(max(u, 1e-300)) / w ** rule.sharpness, 0.0, -i, r))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]), reverse=True)
    return [k[3] for k in keyed]
