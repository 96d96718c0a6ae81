"""TextWorldExpress adapter against the real engine (one JVM per game for the module)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.envs.textworld_express import TextWorldExpressEnv, without_backtracking
from dreamgym.errors import EnvironmentSpecError
from dreamgym.types import Task

GAMES = ["coin", "twc", "cookingworld"]


@pytest.fixture(scope="module", params=GAMES)
def env(request: pytest.FixtureRequest) -> Iterator[TextWorldExpressEnv]:
    e = make_env(EnvConfig(name=f"twx:{request.param}", max_steps=50))
    assert isinstance(e, TextWorldExpressEnv)
    yield e
    e.close()


def _play(env: TextWorldExpressEnv, task: Task, actions: list[str]) -> list[str]:
    states = [env.reset(task).state]
    for a in actions:
        r = env.step(a)
        states.append(r.observation.state)
        if r.done:
            break
    return states


def test_tasks_are_reproducible_and_described(env: TextWorldExpressEnv) -> None:
    tasks = env.tasks(3, first=7)
    assert tasks == env.tasks(3, first=7)
    t = tasks[0]
    assert t.task_id.startswith(f"twx:{env.game}/train/seed=7/")
    assert t.params["seed"] == 7 and t.params["split"] == "train"
    assert t.instruction and t.env == env.spec
    test_task = env.tasks(1, first=7, split="test")[0]
    assert test_task.params["seed"] == 20_007 and "/test/" in test_task.task_id


def test_gold_actions_win(env: TextWorldExpressEnv) -> None:
    for task in env.tasks(5):
        obs = env.reset(task)
        assert obs.state and obs.instruction == task.instruction
        assert obs.admissible_actions == sorted(obs.admissible_actions or [])
        gold = env.gold_actions()
        assert gold
        total, result = 0.0, None
        for a in gold:
            result = env.step(a)
            total += result.reward
            if result.done:
                break
        assert result is not None and result.done and result.success, (task.task_id, gold)
        assert total == pytest.approx(1.0)
        assert result.info["truncated"] is False


def test_a_gold_walk_loses_its_dead_ends() -> None:
    walk = ["look around", "move north", "move east", "move west", "move south", "move east", "take coin"]
    assert without_backtracking(walk) == ["look around", "move east", "take coin"]
    assert without_backtracking(["open door to east", "move east", "move west", "move east"]) == [
        "open door to east", "move east"]


def test_the_gold_plan_wins_large_maps_with_doors() -> None:
    """The engine's gold agent walks randomly (a fresh walk per request); the plan is the shortest of several,
    and removing back-and-forth moves must keep it winning when doors have to be opened."""
    e = make_env(EnvConfig(name="twx:coin", params={"numLocations": 8, "includeDoors": 1}, max_steps=60))
    assert isinstance(e, TextWorldExpressEnv)
    try:
        for task in e.tasks(4):
            e.reset(task)
            gold = e.gold_actions()
            assert gold and gold == without_backtracking(gold)
            result = None
            for a in gold:
                result = e.step(a)
                if result.done:
                    break
            assert result is not None and result.success, (task.task_id, gold)
    finally:
        e.close()


def test_random_admissible_actions_run_to_done(env: TextWorldExpressEnv) -> None:
    rng = random.Random(0)
    for task in env.tasks(10, first=100):
        obs = env.reset(task)
        for steps in range(1, env.max_steps + 1):  # noqa: B007 - checked after the loop
            assert obs.admissible_actions
            r = env.step(rng.choice(obs.admissible_actions))
            assert r.info["admissible"]
            obs = r.observation
            if r.done:
                break
        assert r.done and steps <= env.max_steps
        assert r.success or r.info["truncated"] or r.info["task_failure"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look around")


def test_same_seed_same_observations_different_seeds_differ(env: TextWorldExpressEnv) -> None:
    task = env.tasks(1, first=3)[0]
    env.reset(task)
    actions = env.gold_actions() or []
    assert _play(env, task, actions) == _play(env, task, actions)
    firsts = set()
    for t in env.tasks(8, first=20):
        env.reset(t)
        firsts.add((env.reset(t).state, tuple(env.gold_actions() or [])))
    assert len(firsts) > 1


def test_gold_requested_mid_episode_keeps_state(env: TextWorldExpressEnv) -> None:
    task = env.tasks(1, first=11)[0]
    env.reset(task)
    gold = env.gold_actions() or []
    env.reset(task)
    env.step(gold[0])
    state_before = env.step(gold[1]).observation.state if len(gold) > 2 else None
    assert env.gold_actions() == gold
    if state_before is not None:  # the replay restored the state: the next gold step still works
        rest = [env.step(a) for a in gold[2:]]
        assert rest[-1].success


def test_inadmissible_action_is_answered(env: TextWorldExpressEnv) -> None:
    env.reset(env.tasks(1)[0])
    r = env.step("dance wildly")
    assert not r.done and r.reward == 0 and r.info["admissible"] is False
    assert "not sure" in r.observation.state


def test_max_steps_truncates() -> None:
    with make_env(EnvConfig(name="twx:coin", max_steps=2)) as env:
        env.reset(env.tasks(1)[0])
        first = env.step("inventory")
        assert not first.done
        second = env.step("inventory")
        assert second.done and not second.success and second.info["truncated"] is True


def test_task_params_override_adapter_params() -> None:
    with make_env(EnvConfig(name="twx:coin")) as env:
        task = Task(task_id="custom", env="twx:coin", instruction="", params={"seed": 1, "numLocations": 1})
        obs = env.reset(task)
        assert "coin" in obs.instruction
        assert "To the" not in obs.text  # one room: no exits


def test_unknown_game_lists_valid_names() -> None:
    with pytest.raises(EnvironmentSpecError, match=r"coin.*twc|twc.*coin") as e:
        make_env(EnvConfig(name="twx:nope"))
    assert "cookingworld" in str(e.value)
    assert set(GAMES) <= set(TextWorldExpressEnv.known_names())


def test_unknown_param_names_valid_ones() -> None:
    with pytest.raises(EnvironmentSpecError, match=r"numRooms.*numLocations"):
        make_env(EnvConfig(name="twx:coin", params={"numRooms": 3}))
    with pytest.raises(EnvironmentSpecError, match="integer"):
        make_env(EnvConfig(name="twx:coin", params={"numLocations": "many"}))


def test_out_of_range_param_is_refused_by_engine() -> None:
    with make_env(EnvConfig(name="twx:twc", params={"numLocations": 100})) as env, \
            pytest.raises(EnvironmentSpecError, match=r"refused parameters.*less than"):
        env.tasks(1)
