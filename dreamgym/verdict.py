"""The learning verdict of a ``dreamgym train`` run, in words a newcomer reads first.

A run's held-out success before and after training is two samples of a few dozen episodes each: the same weights
score 66-78% on the same 32 tasks depending only on the sampling seed. So the verdict is never the raw change; it is
the change with its 95% interval, and a change whose interval holds 0 reads "within noise", not as a gain or a harm.

The interval:

- with the per-episode outcomes of both evaluations on the same tasks (``outcomes`` of the eval records), a
  **paired** interval for the difference of matched proportions (Agresti and Min 2005: add 1/2 to each cell of the
  2x2 table of before/after outcomes, then Wald), which uses that the same tasks were played twice;
- else a **two-proportion** interval (Agresti and Caffo 2000: add one success and one failure to each sample, then
  Wald), which treats the two evaluations as independent samples.

Both keep a sensible width at 0% or 100% success, where the plain Wald interval collapses to a point.

The verdict also says how many learner steps were taken (0 steps means the final figure is the start policy
measured again, and says what to change) and what the run cost.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

#: z of a two-sided 95% normal interval.
Z95 = 1.959963984540054

Outcome = Literal["improved", "within noise", "worse", "no learner step", "not measured"]

#: What to change when no GRPO group had reward variance (the config fields that add groups or episodes per group).
NO_STEP_ADVICE = ("give each iteration more chances of a group with mixed outcomes: more episodes per group "
                  "(`--learner.group_size 8`), more tasks per iteration (`--curriculum.tasks_per_iteration 4`), "
                  "or extra rounds for such iterations (`--train.resample.min_mixed_groups 1`)")


@dataclass(frozen=True)
class Interval:
    """A change of success rate (after - before, as a fraction) with its 95% interval."""

    change: float
    low: float
    high: float
    method: Literal["paired", "two-proportion"]
    n_before: int
    n_after: int

    def points(self) -> str:
        """``[-25, +7] points``: the interval in percentage points, signed."""
        return f"[{_signed(self.low)}, {_signed(self.high)}] points"


def _signed(x: float) -> str:
    v = round(100 * x)
    return f"+{v}" if v > 0 else str(v)


def _clip(x: float) -> float:
    return max(-1.0, min(1.0, x))


def paired_interval(before: Sequence[bool], after: Sequence[bool]) -> Interval:
    """The change of success on the same episodes' tasks (``before[i]`` and ``after[i]`` are one task's outcomes),
    with the Agresti-Min adjusted Wald interval for matched proportions."""
    if len(before) != len(after) or not before:
        raise ValueError(f"paired outcomes need two equally long, non-empty lists (got {len(before)} and "
                         f"{len(after)})")
    n = len(before)
    gained = sum(1 for b, a in zip(before, after, strict=True) if a and not b)
    lost = sum(1 for b, a in zip(before, after, strict=True) if b and not a)
    m = n + 2  # half a pair added to each of the four cells
    p01, p10 = (gained + 0.5) / m, (lost + 0.5) / m
    d_adj = p01 - p10
    half = Z95 * math.sqrt(max(p01 + p10 - d_adj * d_adj, 0.0) / m)
    return Interval((gained - lost) / n, _clip(d_adj - half), _clip(d_adj + half), "paired", n, n)


def two_proportion_interval(p_before: float, n_before: int, p_after: float, n_after: int) -> Interval:
    """The change between two independent success rates (``p`` of ``n`` episodes each), with the Agresti-Caffo
    interval."""
    if n_before < 1 or n_after < 1:
        raise ValueError(f"each evaluation needs at least one episode (got {n_before} and {n_after})")
    a = (p_before * n_before + 1) / (n_before + 2)
    b = (p_after * n_after + 1) / (n_after + 2)
    half = Z95 * math.sqrt(a * (1 - a) / (n_before + 2) + b * (1 - b) / (n_after + 2))
    return Interval(p_after - p_before, _clip(b - a - half), _clip(b - a + half), "two-proportion", n_before, n_after)


def episode_outcomes(records: Iterable[dict[str, Any]]) -> list[list[Any]]:
    """``[task_id, 0|1]`` per episode, sorted by task id, from an evaluation's per-episode records
    (``dreamgym.eval_records.episode_records``): the compact form kept in each eval record (``outcomes``), which
    lets two evaluations of the same tasks be compared pair by pair."""
    return sorted([r["task_id"], int(bool(r["success"]))] for r in records)


def _pairs(before: Sequence[Sequence[Any]], after: Sequence[Sequence[Any]]) -> tuple[list[bool], list[bool]] | None:
    """Matched outcomes of two evaluations (the k-th episode of a task before with its k-th after), or ``None`` when
    they did not play the same tasks the same number of times (a lost worker's episodes, another task set)."""
    by_task: dict[str, list[list[bool]]] = defaultdict(lambda: [[], []])
    for side, rows in enumerate((before, after)):
        for task_id, success in rows:
            by_task[str(task_id)][side].append(bool(success))
    if not by_task or any(len(b) != len(a) for b, a in by_task.values()):
        return None
    xs = [x for b, _ in by_task.values() for x in b]
    ys = [y for _, a in by_task.values() for y in a]
    return xs, ys


def change_interval(start: dict[str, Any], final: dict[str, Any]) -> Interval:
    """The change of held-out success between two eval records: paired where both carry per-episode ``outcomes`` of
    the same tasks, else two-proportion on their rates and episode counts."""
    pairs = _pairs(start.get("outcomes") or [], final.get("outcomes") or [])
    if pairs is not None:
        return paired_interval(*pairs)
    return two_proportion_interval(float(start["success_rate"]), int(start["episodes"]),
                                   float(final["success_rate"]), int(final["episodes"]))


@dataclass
class Verdict:
    """What a run's report opens with: the outcome, its interval, the learner steps and the cost."""

    outcome: Outcome
    headline: str
    """One sentence: did held-out success change beyond the spread of its start?"""
    interval: Interval | None = None
    details: list[str] = field(default_factory=list)
    """The learner steps and the cost, a sentence each."""

    def markdown(self) -> list[str]:
        """The report's opening section."""
        return ["## Did it learn?", "", f"**{self.headline}**", "", *[f"- {d}" for d in self.details], ""]


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _steps_sentence(summary: dict[str, Any]) -> str:
    steps, iters = int(summary.get("learner_steps") or 0), int(summary.get("iterations") or 0)
    if iters == 0:
        return "No training iteration ran (`train.iterations` 0): this run only evaluates the start policy."
    if steps == 0:
        return (f"No learner step was taken: no GRPO group had reward variance in any of the {iters} iterations "
                f"(every group's episodes all won or all lost), so the weights are the start's. To change that, "
                f"{NO_STEP_ADVICE}.")
    return f"{steps} learner step{'s' if steps != 1 else ''} taken in {iters} iteration{'s' if iters != 1 else ''}."


def _cost_sentence(summary: dict[str, Any]) -> str:
    minutes = float(summary.get("wall_seconds") or 0.0) / 60
    real, synth = int(summary.get("real_transitions") or 0), int(summary.get("synthetic_transitions") or 0)
    invalid = int(summary.get("invalid_transitions") or 0)
    ev, off = summary.get("eval_transitions"), summary.get("offline_transitions")
    apart = [f"{int(x)} {what}" for x, what in ((ev, "for evaluation"), (off, "offline, before training")) if x]
    counted_apart = f"; real transitions counted apart: {', '.join(apart)}" if apart else ""
    return (f"Cost: {minutes:.1f} min wall time; {real} real transitions for training, {synth} synthetic "
            f"({invalid} invalid, left out){counted_apart}.")


def learning_verdict(summary: dict[str, Any]) -> Verdict:
    """The verdict of a run from its ``summary.json`` (``actors.driver``: ``evals``, ``learner_steps``,
    ``iterations``, ``wall_seconds``, transition counts)."""
    evals = summary.get("evals") or []
    start = next((e for e in evals if e.get("label") == "start"), None)
    final = evals[-1] if evals and evals[-1] is not start else None
    details = [_steps_sentence(summary), _cost_sentence(summary)]
    if start is None or final is None:
        return Verdict("not measured", "Not measured: held-out success was not evaluated both before and after "
                       "training (`train.eval.enabled`, `train.eval.at_start`), so this run cannot say whether the "
                       "policy improved.", None, details)
    iv = change_interval(start, final)
    moved = f"{_pct(start['success_rate'])} -> {_pct(final['success_rate'])}"
    where = (f"95% interval of the change {iv.points()}, {iv.method} over {iv.n_after} held-out episodes"
             if iv.method == "paired" else
             f"95% interval of the change {iv.points()}, {iv.method} over {iv.n_before} and {iv.n_after} episodes")
    if int(summary.get("learner_steps") or 0) == 0 and int(summary.get("iterations") or 0) > 0:
        return Verdict("no learner step", f"Held-out success {moved}: the same weights measured twice, since no "
                       f"learner step was taken ({where}).", iv, details)
    if iv.low > 0:
        return Verdict("improved", f"Held-out success improved: {moved}, beyond the spread of its start ({where}).",
                       iv, details)
    if iv.high < 0:
        return Verdict("worse", f"Held-out success got worse: {moved}, beyond the spread of its start ({where}).",
                       iv, details)
    return Verdict("within noise", f"Held-out success {moved}, within noise: no change beyond the spread of its "
                   f"start ({where}).", iv, details)


def verdict_line(summary: dict[str, Any]) -> str:
    """The last line of ``dreamgym train``: ``held-out real success 75% -> 66%, within noise (95% interval of the
    change [-25, +7] points); 4 learner steps; 16.0 min, 103 real and 80 synthetic transitions``."""
    v = learning_verdict(summary)
    steps = int(summary.get("learner_steps") or 0)
    cost = (f"{float(summary.get('wall_seconds') or 0) / 60:.1f} min, {int(summary.get('real_transitions') or 0)} "
            f"real and {int(summary.get('synthetic_transitions') or 0)} synthetic transitions for training")
    if v.interval is None:
        change = "held-out real success not measured before and after"
    else:
        evals = summary["evals"]
        start = next(e for e in evals if e.get("label") == "start")
        words = {"no learner step": "the same weights measured twice"}.get(v.outcome, v.outcome)
        change = (f"held-out real success {_pct(start['success_rate'])} -> {_pct(evals[-1]['success_rate'])}, "
                  f"{words} (95% interval of the change {v.interval.points()})")
    step_s = ("no learner step (no GRPO group had reward variance)" if steps == 0 and summary.get("iterations")
              else f"{steps} learner step{'s' if steps != 1 else ''}")
    return f"{change}; {step_s}; {cost}"
