"""ScienceWorld adapter against the real engine.

ScienceWorld loads a variation in 0.1-1 s and enumerates valid actions in ~0.3 s, so the module
shares one JVM and plays ``find-non-living-thing`` variation 2, whose gold path is three steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.envs.scienceworld import ScienceWorldEnv, canonical_listing
from dreamgym.errors import EnvironmentSpecError

TASK = "find-non-living-thing"


@pytest.fixture(scope="module")
def env() -> Iterator[ScienceWorldEnv]:
    e = make_env(EnvConfig(name=f"sciworld:{TASK}", max_steps=10, admissible_actions=False))
    assert isinstance(e, ScienceWorldEnv)
    yield e
    e.close()


def test_task_names_without_jvm() -> None:
    names = ScienceWorldEnv.known_names()
    assert len(names) == 30 and TASK in names and "boil" in names


def test_unknown_task_lists_valid_names() -> None:
    with pytest.raises(EnvironmentSpecError, match="valid task names") as e:
        make_env(EnvConfig(name="sciworld:boil-an-egg"))
    assert "find-non-living-thing" in str(e.value) and "boil-an-egg" in str(e.value)


def test_bad_params_are_refused() -> None:
    with pytest.raises(EnvironmentSpecError, match="simplifications"):
        make_env(EnvConfig(name="sciworld:boil", params={"difficulty": "easy"}))
    with pytest.raises(EnvironmentSpecError, match="openDoors"):
        make_env(EnvConfig(name="sciworld:boil", params={"simplifications": "openWindows"}))
    with pytest.raises(EnvironmentSpecError, match="electrical"):
        make_env(EnvConfig(name="sciworld:power-component", params={"simplifications": "noElectricalAction"}))


def test_variations_of_splits(env: ScienceWorldEnv) -> None:
    train, test = env.variations("train"), env.variations("test")
    assert train[:3] == [0, 1, 2] and not set(train) & set(test)
    with pytest.raises(EnvironmentSpecError, match="variations"):
        env.tasks(1, first=len(train))


def test_gold_path_wins(env: ScienceWorldEnv) -> None:
    task = env.tasks(1, first=2)[0]
    assert task.task_id == f"sciworld:{TASK}/train/var=2/easy"
    assert task.instruction.startswith("Your task is to find a(n) non-living thing")
    obs = env.reset(task)
    assert "This room is called" in obs.state and obs.admissible_actions is None
    gold = env.gold_actions()
    assert gold and len(gold) <= 5
    total, result = 0.0, None
    for action in gold:
        result = env.step(action)
        total += result.reward
        if result.done:
            break
    assert result is not None and result.done and result.success
    assert total == pytest.approx(1.0) and result.info["score"] == 100


def test_admissible_actions_and_unknown_action(env: ScienceWorldEnv) -> None:
    task = env.tasks(1, first=2)[0]
    env.with_admissible = True
    try:
        obs = env.reset(task)
        assert obs.admissible_actions and "look around" in obs.admissible_actions
        assert obs.admissible_actions == sorted(obs.admissible_actions)
        r = env.step("dance wildly")
        assert not r.done and r.reward == 0 and r.info["admissible"] is False
        assert "No known action" in r.observation.state
    finally:
        env.with_admissible = False


def test_max_steps_truncates(env: ScienceWorldEnv) -> None:
    env.reset(env.tasks(1, first=2)[0])
    results = [env.step("look around") for _ in range(env.max_steps)]
    assert not any(r.done for r in results[:-1])
    assert results[-1].done and results[-1].info["truncated"] and not results[-1].success


def test_listing_order_is_canonical() -> None:
    a = "In it, you see: \n\ta wood cup (containing red paint)\n\ta wood cup (containing blue paint)\nYou also see:"
    b = "In it, you see: \n\ta wood cup (containing blue paint)\n\ta wood cup (containing red paint)\nYou also see:"
    assert canonical_listing(a) == canonical_listing(b)
