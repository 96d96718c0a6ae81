"""The loop's pieces without a cluster: the sim-to-real schedule (phases per mode, the real-transition budget,
task filtering), stale groups and the iteration log."""

from __future__ import annotations

import pytest

from dreamgym.config import load_config
from dreamgym.rollout import split_stale
from dreamgym.schedule import RolloutPlan, Schedule, rollout_plan
from dreamgym.train_state import IterationLog, TrainState
from dreamgym.types import Group, Task, Trajectory


def test_phases_of_each_mode() -> None:
    assert [Schedule("synthetic", 3).phase(t) for t in range(3)] == ["synthetic"] * 3
    assert [Schedule("real", 3).phase(t) for t in range(3)] == ["real"] * 3
    assert [Schedule("s2r", 4, synthetic_iterations=2).phase(t) for t in range(4)] == [
        "synthetic", "synthetic", "real", "real"]


def test_uses_synthetic_only_when_an_iteration_trains_in_synthesis() -> None:
    assert Schedule("synthetic", 1).uses_synthetic
    assert not Schedule("real", 5).uses_synthetic
    assert Schedule("s2r", 3, synthetic_iterations=1).uses_synthetic
    assert not Schedule("s2r", 3, synthetic_iterations=0).uses_synthetic


def test_the_real_budget_stops_real_iterations_only() -> None:
    s = Schedule("s2r", 6, synthetic_iterations=2, real_budget=100)
    assert s.can_launch(1, real_transitions=500)  # synthetic iterations spend no real transitions
    assert s.can_launch(2, real_transitions=99) and not s.can_launch(2, real_transitions=100)
    assert not s.can_launch(6, real_transitions=0)  # past ``iterations``
    unlimited = Schedule("real", 2)
    assert unlimited.budget_left(10**9) and unlimited.can_launch(1, 10**9) and not unlimited.can_launch(2, 0)


def test_text_only_variants_train_in_synthesis_only() -> None:
    tasks = [Task(task_id="a", env="twx:coin", instruction="x"),
             Task(task_id="b", env="twx:coin", instruction="y", kind="llm")]
    assert Schedule.trainable_tasks(tasks, "synthetic") == (tasks, 0)
    assert Schedule.trainable_tasks(tasks, "real") == (tasks[:1], 1)


def test_rollout_phases_name_their_environment_and_policy() -> None:
    assert (rollout_plan("synthetic").env, rollout_plan("synthetic").policy) == ("synthetic", "policy")
    assert rollout_plan("eval").env == "eval" and rollout_plan("random") == RolloutPlan("eval", "random")
    with pytest.raises(ValueError, match=r"phase 'dream'; expected one of synthetic, real, eval, random"):
        rollout_plan("dream")


def test_schedule_from_the_train_config() -> None:
    cfg = load_config(None, ["--train.mode", "s2r", "--train.iterations", "5", "--train.synthetic_iterations", "3",
                             "--train.real_budget", "40"])
    assert Schedule.from_config(cfg.train) == Schedule("s2r", 5, 3, 40)


def _group(version: int) -> Group:
    task = Task(task_id=f"v{version}", env="twx:coin", instruction="x")
    return Group(task, [Trajectory(task, [], r > 0, r, weight_version=version) for r in (0.0, 1.0)])


def test_stale_groups_are_split_off_by_weight_version() -> None:
    groups = [_group(3), _group(2), _group(1)]
    fresh, stale = split_stale(groups, version=3, max_staleness=1)
    assert fresh == groups[:2] and stale == groups[2:]
    assert split_stale(groups, version=3, max_staleness=0) == (groups[:1], groups[1:])


def test_iteration_log_times_phases_into_the_run_counters() -> None:
    state = TrainState()
    log = IterationLog(state)
    with log.timed("learner"):
        pass
    log.add("synthetic", 2.5, episodes=8, steps=40)
    log.note(stale_groups=0)
    rec = log.record()
    assert rec["stale_groups"] == 0 and set(rec["phase_seconds"]) == {"learner", "synthetic"}
    assert state.phase_seconds["synthetic"] == 2.5 and state.phase_steps["synthetic"] == 40


def test_only_real_iterations_need_the_real_environment_for_training() -> None:
    assert not Schedule("synthetic", 4).uses_real_training
    assert Schedule("real", 1).uses_real_training
    assert Schedule("s2r", 3, synthetic_iterations=2).uses_real_training
    assert not Schedule("s2r", 2, synthetic_iterations=2).uses_real_training
