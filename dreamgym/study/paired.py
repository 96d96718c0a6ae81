"""Paired comparison of two arms on the same held-out episodes: mean difference, paired bootstrap interval,
exact McNemar test, and the power calculation that sizes a study.

Every arm of a study is evaluated on the same held-out tasks, and arm-seed ``k`` of every arm runs with training
seed ``k`` (run seed and engine sampling seed). So an episode of arm A and one of arm B are a *pair* when they
share ``(seed, task_id, episode)`` (``dreamgym.eval_records``). Paired differences remove the task-to-task spread
(some maps are easy for every policy), which dominates the unpaired t-interval over a few seeds.

- ``diff``: mean over pairs of ``success_A - scale x success_B`` (``scale`` 1, or 0.95 for "A reaches 95% of B").
- ``ci95``: percentile interval of a two-way paired bootstrap: each resample draws the common training seeds with
  replacement and, independently, the common tasks with replacement, and averages the (seed, task) cells'
  mean differences over the drawn grid (weights = how often each seed and task was drawn). Training seeds and
  tasks are the two sources of spread the study's claims generalise over. ``B`` resamples from a fixed
  ``random.Random(seed)``: the same records give the same interval.
- ``p_mcnemar``: exact two-sided McNemar test on the discordant pairs (A won and B lost: ``n10``; the reverse:
  ``n01``): ``p = min(1, 2 x P(X <= min(n10, n01)))`` with ``X ~ Binomial(n10 + n01, 1/2)``; 1 with no
  discordant pair. (It treats pairs as independent, ignoring the seed clustering the bootstrap keeps.)
- ``power``: from the measured spread of the paired differences, the variance of the study's estimate with
  ``S`` seeds x ``E`` episodes per seed is ``sigma_seed^2 / S + sigma_episode^2 / (S E)``, where
  ``sigma_episode^2`` is the pooled within-seed variance of the per-episode differences and ``sigma_seed^2`` the
  variance of the per-seed mean differences beyond what the episodes explain (0 when one seed was measured: then
  the figure is a lower bound). A difference ``delta`` is resolved at two-sided level 0.05 with power 0.8 when
  ``(z_0.975 + z_0.8)^2 x Var <= delta^2``.

No scipy: binomial tails are summed exactly with ``math.comb``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

#: z quantiles for the power calculation: two-sided 95% and 80% power.
Z975 = 1.959964
Z80 = 0.841621

#: An arm's outcomes: ``(seed, task_id, episode) -> success (0 or 1)``.
Outcomes = Mapping[tuple[int, str, int], float]


def mcnemar_exact(n10: int, n01: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (see the module docstring)."""
    if n10 < 0 or n01 < 0:
        raise ValueError(f"discordant counts must be non-negative, got {n10}, {n01}")
    n = n10 + n01
    if n == 0:
        return 1.0
    k = min(n10, n01)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def _cells(a: Outcomes, b: Outcomes, scale: float) -> dict[int, dict[str, list[float]]]:
    """Per seed, per task: the paired differences of their common episodes."""
    cells: dict[int, dict[str, list[float]]] = {}
    for key in sorted(set(a) & set(b)):
        seed, task, _ = key
        cells.setdefault(seed, {}).setdefault(task, []).append(float(a[key]) - scale * float(b[key]))
    return cells


def paired_bootstrap(cells: Mapping[int, Mapping[str, Sequence[float]]], resamples: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean difference under the two-way (seeds x tasks) bootstrap."""
    seeds = sorted(cells)
    tasks = sorted({t for c in cells.values() for t in c})
    mean = {(s, t): sum(v) / len(v) for s in seeds for t, v in cells[s].items() if v}
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        ws = [0] * len(seeds)
        for _ in seeds:
            ws[rng.randrange(len(seeds))] += 1
        wt = [0] * len(tasks)
        for _ in tasks:
            wt[rng.randrange(len(tasks))] += 1
        num = den = 0.0
        for i, s in enumerate(seeds):
            if not ws[i]:
                continue
            for j, t in enumerate(tasks):
                m = mean.get((s, t))
                if m is None or not wt[j]:
                    continue
                w = ws[i] * wt[j]
                num += w * m
                den += w
        if den:
            stats.append(num / den)
    stats.sort()
    lo = stats[math.floor(0.025 * (len(stats) - 1))]
    hi = stats[math.ceil(0.975 * (len(stats) - 1))]
    return lo, hi


def compare(a: Outcomes, b: Outcomes, *, scale: float = 1.0, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``diff``, ``ci95``, ``p_mcnemar``, ``n`` (pairs), ``seeds`` and ``tasks`` of ``a`` against ``b`` (see the
    module docstring); ``None`` figures when the arms share no episode."""
    cells = _cells(a, b, scale)
    keys = sorted(set(a) & set(b))
    n10 = sum(a[k] > 0.5 and b[k] <= 0.5 for k in keys)
    n01 = sum(a[k] <= 0.5 and b[k] > 0.5 for k in keys)
    out: dict[str, Any] = {"n": len(keys), "seeds": sorted(cells), "tasks": len({t for c in cells.values() for t in c}),
                           "n10": n10, "n01": n01, "scale": scale}
    if not keys:
        return {**out, "diff": None, "ci95": None, "p_mcnemar": None}
    diffs = [d for c in cells.values() for v in c.values() for d in v]
    lo, hi = paired_bootstrap(cells, resamples, seed)
    return {**out, "diff": sum(diffs) / len(diffs), "ci95": [lo, hi], "p_mcnemar": mcnemar_exact(n10, n01),
            "spread": spread(cells)}


def spread(cells: Mapping[int, Mapping[str, Sequence[float]]]) -> dict[str, Any]:
    """The measured spread of paired differences: ``sigma_episode^2`` (pooled within-seed variance of the
    per-episode differences), ``sigma_seed^2`` (variance of the per-seed means beyond the episodes' share; ``None``
    with one seed) and the mean episodes per seed."""
    per_seed = [[d for v in c.values() for d in v] for _, c in sorted(cells.items())]
    per_seed = [x for x in per_seed if x]
    if not per_seed:
        return {"sigma_episode2": None, "sigma_seed2": None, "episodes_per_seed": 0, "seeds": 0}
    dof = sum(len(x) - 1 for x in per_seed)
    within = sum(sum((d - sum(x) / len(x)) ** 2 for d in x) for x in per_seed)
    s_ep = within / dof if dof > 0 else 0.0
    e = sum(len(x) for x in per_seed) / len(per_seed)
    s_seed = None
    if len(per_seed) >= 2:
        means = [sum(x) / len(x) for x in per_seed]
        m = sum(means) / len(means)
        var_means = sum((x - m) ** 2 for x in means) / (len(means) - 1)
        s_seed = max(0.0, var_means - s_ep / e)
    return {"sigma_episode2": s_ep, "sigma_seed2": s_seed, "episodes_per_seed": e, "seeds": len(per_seed)}


def seeds_needed(sigma_episode2: float, sigma_seed2: float | None, episodes: int, delta: float = 0.10) -> int:
    """Training seeds that resolve a paired difference ``delta`` (two-sided 0.05, power 0.8) with ``episodes``
    held-out episodes per seed (at least 1)."""
    if episodes < 1 or delta <= 0:
        raise ValueError(f"episodes must be >= 1 and delta > 0, got {episodes}, {delta}")
    per_seed = (sigma_seed2 or 0.0) + sigma_episode2 / episodes
    return max(1, math.ceil((Z975 + Z80) ** 2 * per_seed / delta**2))


def resolvable(sigma_episode2: float, sigma_seed2: float | None, seeds: int, episodes: int) -> float:
    """The smallest paired difference ``seeds`` x ``episodes`` resolve (two-sided 0.05, power 0.8)."""
    var = ((sigma_seed2 or 0.0) + sigma_episode2 / episodes) / seeds
    return (Z975 + Z80) * math.sqrt(var)


def power_table(measured: dict[str, Any], delta: float = 0.10,
                episodes: Sequence[int] = (64, 128, 256)) -> dict[str, Any]:
    """The power calculation of one measured pair's ``spread``: seeds needed per episodes-per-seed, and the
    difference the measured design resolves."""
    s_ep, s_seed = measured.get("sigma_episode2"), measured.get("sigma_seed2")
    if s_ep is None:
        return {"delta": delta, "rows": [], "note": "no paired episodes measured"}
    if s_ep == 0 and not s_seed:  # every pair agreed: a zero variance would claim one seed resolves anything
        return {"delta": delta, "rows": [], "sigma_episode2": 0.0, "sigma_seed2": s_seed,
                "note": "no spread measured (every episode pair agreed): no power calculation"}
    e_now, n_now = max(1, round(measured["episodes_per_seed"])), measured["seeds"]
    sizes = sorted({*episodes, e_now})
    return {"delta": delta, "alpha": 0.05, "power": 0.8, "sigma_episode2": s_ep, "sigma_seed2": s_seed,
            "measured_seeds": n_now, "measured_episodes_per_seed": e_now,
            "resolvable_now": resolvable(s_ep, s_seed, n_now, e_now),
            "rows": [{"episodes_per_seed": e, "seeds_needed": seeds_needed(s_ep, s_seed, e, delta)} for e in sizes],
            "note": ("between-seed spread measured over several seeds" if s_seed is not None else
                     "one seed measured: no between-seed spread, so the seeds needed are a lower bound")}
