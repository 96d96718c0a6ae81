"""The learning verdict a run's report and the last line of ``dreamgym train`` open with (``dreamgym.verdict``).

Fast: summaries shaped as ``actors.driver`` writes them (``summary.json``), no Ray. The four cases a newcomer meets:
improved, within noise, worse, and no learner step at all (the fresh clone's ``make run`` of issue 33: 75% -> 66%
with 0 learner steps, which read like harm).
"""

from __future__ import annotations

from typing import Any

import pytest

from dreamgym.report import write_report
from dreamgym.verdict import learning_verdict, paired_interval, two_proportion_interval, verdict_line


def _eval(label: str, wins: list[int], tasks: list[str] | None = None) -> dict[str, Any]:
    tasks = tasks or [f"twx:coin/test/seed={i}" for i in range(len(wins))]
    return {"label": label, "iteration": 0 if label == "start" else 4, "real_transitions": 0,
            "success_rate": sum(wins) / len(wins), "mean_reward": sum(wins) / len(wins), "episodes": len(wins),
            "baseline_success_rate": 0.56, "baseline_mean_reward": 0.56,
            "outcomes": sorted([t, w] for t, w in zip(tasks, wins, strict=True))}


def _summary(start: list[int], final: list[int], steps: int = 3, paired: bool = True) -> dict[str, Any]:
    evals = [_eval("start", start), _eval("final", final)]
    if not paired:
        for e in evals:
            del e["outcomes"]
    return {"run_dir": "runs/x", "mode": "s2r", "iterations": 4, "learner_steps": steps, "real_transitions": 103,
            "synthetic_transitions": 80, "invalid_transitions": 6, "eval_transitions": 1153,
            "offline_transitions": 544, "success_start": evals[0]["success_rate"],
            "success_final": evals[1]["success_rate"], "baseline_success": 0.56, "wall_seconds": 960.0,
            "phase_seconds": {}, "evals": evals}


def test_improved_beyond_the_spread_of_the_start() -> None:
    start, final = [1] * 20 + [0] * 44, [1] * 20 + [1] * 30 + [0] * 14  # 31% -> 78%, 30 tasks won that were lost
    v = learning_verdict(_summary(start, final))
    assert v.outcome == "improved" and v.interval is not None and v.interval.method == "paired"
    assert v.interval.low > 0 and v.headline.startswith("Held-out success improved: 31% -> 78%")
    assert "3 learner steps taken in 4 iterations." in v.details
    assert v.details[1].startswith("Cost: 16.0 min wall time; 103 real transitions for training, 80 synthetic")
    assert "improved (95% interval of the change [+" in verdict_line(_summary(start, final))


def test_a_drop_inside_the_interval_reads_within_noise_not_as_harm() -> None:
    start = [1] * 24 + [0] * 8  # 75% on 32 tasks
    final = [1] * 18 + [0] * 6 + [1] * 3 + [0] * 5  # 66%: 6 won before lost, 3 lost before won
    v = learning_verdict(_summary(start, final))
    assert v.outcome == "within noise" and v.interval is not None
    assert v.interval.low < 0 < v.interval.high
    line = verdict_line(_summary(start, final))
    assert line.startswith("held-out real success 75% -> 66%, within noise (95% interval of the change [-")
    assert "worse" not in line and "; 3 learner steps; 16.0 min, 103 real and 80 synthetic transitions" in line


def test_worse_beyond_the_spread_of_the_start() -> None:
    start, final = [1] * 50 + [0] * 14, [1] * 20 + [0] * 44  # 78% -> 31%
    v = learning_verdict(_summary(start, final))
    assert v.outcome == "worse" and v.interval is not None and v.interval.high < 0
    assert v.headline.startswith("Held-out success got worse: 78% -> 31%")


def test_no_learner_step_says_so_and_what_to_change() -> None:
    start = [1] * 24 + [0] * 8
    final = [1] * 18 + [0] * 6 + [1] * 3 + [0] * 5
    s = _summary(start, final, steps=0)
    v = learning_verdict(s)
    assert v.outcome == "no learner step" and "the same weights measured twice" in v.headline
    assert v.details[0].startswith("No learner step was taken: no GRPO group had reward variance")
    assert "--learner.group_size" in v.details[0] and "--curriculum.tasks_per_iteration" in v.details[0]
    line = verdict_line(s)
    assert "75% -> 66%, the same weights measured twice" in line
    assert "no learner step (no GRPO group had reward variance)" in line


def test_without_per_episode_outcomes_the_interval_is_two_proportion() -> None:
    start = [1] * 24 + [0] * 8
    final = [1] * 21 + [0] * 11
    v = learning_verdict(_summary(start, final, paired=False))
    assert v.interval is not None and v.interval.method == "two-proportion" and v.outcome == "within noise"
    # Agresti-Caffo for 24/32 vs 21/32: the adjusted rates 25/34 and 22/34, +-1.96 x their standard error
    assert v.interval.low == pytest.approx(-0.3069, abs=5e-4) and v.interval.high == pytest.approx(0.1304, abs=5e-4)


def test_the_intervals_keep_a_width_at_the_edges() -> None:
    same = paired_interval([True] * 32, [True] * 32)  # nothing changed, but 32 pairs do not prove "exactly 0"
    assert same.change == 0 and same.low < -0.02 and same.high > 0.02
    full = two_proportion_interval(1.0, 16, 1.0, 16)
    assert full.change == 0 and full.low < -0.05 and full.high > 0.05
    with pytest.raises(ValueError, match="equally long"):
        paired_interval([True], [True, False])


def test_not_measured_without_a_start_evaluation(tmp_path) -> None:
    s = _summary([1, 0], [1, 1])
    s["evals"] = s["evals"][1:]  # train.eval.at_start false: only the final figure
    v = learning_verdict(s)
    assert v.outcome == "not measured" and v.interval is None
    assert verdict_line(s).startswith("held-out real success not measured before and after")


def test_the_report_opens_with_the_verdict(tmp_path) -> None:
    import json

    (tmp_path / "summary.json").write_text(json.dumps(_summary([1] * 24 + [0] * 8, [1] * 21 + [0] * 11, steps=0)))
    (tmp_path / "metrics.jsonl").write_text("")
    text = write_report(tmp_path).read_text().splitlines()
    assert text[2] == "## Did it learn?"
    assert text[4].startswith("**Held-out success 75% -> 66%: the same weights measured twice")
    assert text[6].startswith("- No learner step was taken")
