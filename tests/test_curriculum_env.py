"""Parameter variants checked in the real environments (TextWorldExpress, ScienceWorld), and the task
grammar built from what the real environment shows."""

from __future__ import annotations

import json
from pathlib import Path

from dreamgym.config import load_config
from dreamgym.curriculum import REJECT_REASONS, ClientTextGenerator
from dreamgym.curriculum.build import build_curriculum
from dreamgym.envs.registry import make_env
from dreamgym.experience.client import FunctionClient


def _cfg(**cur: object) -> object:
    over = {"env": {"name": "twx:coin"}, "curriculum": {"llm_variants": 0, "min_parent_variance": 0.0, **cur}}
    return load_config(overrides=over)


def test_param_variants_are_real_twx_games(java_available: bool) -> None:
    assert java_available
    cfg = _cfg(seed_tasks=4, param_variants=4, parents_per_iteration=2)
    env = make_env(cfg.env)
    try:
        cur = build_curriculum(cfg, env=env)
        assert {"kitchen", "coin", "north"} <= cur.grammar.vocabulary  # words the real game shows
        seeds = [r.task for r in cur.pool]
        cur.record(seeds[0].task_id, [0, 1, 1, 0])
        cur.record(seeds[1].task_id, [1, 0, 0, 0])
        accepted = cur.generate()
        m = cur.metrics()
    finally:
        env.close()
    assert len(accepted) == 2  # one per parent: the first feasible harder candidate
    for task in accepted:
        rec = cur.pool.get(task.task_id)
        assert task.origin == "generated" and task.kind == "param"
        assert rec.parent in {seeds[0].task_id, seeds[1].task_id} and rec.change
        parent = cur.pool.get(rec.parent).task
        assert task.params != parent.params and task.instruction == parent.instruction  # the game's own text
    assert m["generation_attempts_param"] == 8
    assert m["generation_accepted_param"] == 2
    assert m["generation_attempts"] == m["generation_accepted"] + m["generation_rejected"]
    assert set(m["rejected"]) <= set(REJECT_REASONS)
    # Every accepted variant runs in a fresh real environment and its expert plan wins it.
    fresh = make_env(cfg.env)
    try:
        for task in accepted:
            obs = fresh.reset(task)
            assert obs.instruction == task.instruction
            plan = fresh.gold_actions()
            assert plan and len(plan) <= cfg.env.max_steps
            for action in plan:
                result = fresh.step(action)
            assert result.done and result.success
    finally:
        fresh.close()


def test_engine_refusals_are_recorded(tmp_path: Path) -> None:
    """At the engine's limit (11 locations) the harder move is refused; the reason is recorded."""
    f = tmp_path / "tasks.jsonl"
    f.write_text(json.dumps({"task_id": "big", "instruction": "Find the coin.",
                             "params": {"seed": 5, "numLocations": 11, "includeDoors": 0}}) + "\n")
    cfg = _cfg(task_file=str(f), param_variants=3, parents_per_iteration=1, min_seed_tasks=1)
    env = make_env(cfg.env)
    try:
        cur = build_curriculum(cfg, env=env, vocabulary_resets=1)
        cur.record("big", [0, 1])
        cur.generate()
    finally:
        env.close()
    outcomes = cur.outcomes()
    assert len(outcomes) == 3
    refused = [o for o in outcomes if o["reason"] == "env_refused"]
    assert refused and "numLocations 11->12" in refused[0]["text"]
    assert "less than or equal to 11" in refused[0]["detail"]
    assert all(o["accepted"] or o["reason"] in REJECT_REASONS for o in outcomes)


def test_text_variants_use_the_real_vocabulary() -> None:
    """The grammar accepts a variant made of the game's own words and rejects invented ones."""
    replies = iter([
        "Task: Search the kitchen and the pantry for the coin, then take it and open the fridge.",
        "Task: Fly the dragon over the volcano and find the enchanted coin scroll.",
    ])
    client = FunctionClient(lambda messages, sampling: "Choice: 1" if "Candidate" in messages[-1]["content"]
                            else next(replies))
    cfg = _cfg(seed_tasks=2, param_variants=0, llm_variants=2, parents_per_iteration=1)
    env = make_env(cfg.env)
    try:
        cur = build_curriculum(cfg, env=env, generator=ClientTextGenerator(client))
    finally:
        env.close()
    cur.record(next(iter(cur.pool)).task_id, [0, 1])
    (task,) = cur.generate()
    assert task.kind == "llm" and "pantry" in task.instruction
    assert cur.metrics()["rejected"] == {"grammar": 1}
    assert "dragon" in cur.outcomes()[0]["detail"] or "dragon" in cur.outcomes()[-1]["detail"]


def test_sciworld_variation_variants() -> None:
    cfg = load_config(overrides={
        "env": {"name": "sciworld:find-living-thing", "max_steps": 40, "admissible_actions": False},
        "curriculum": {"seed_tasks": 1, "llm_variants": 0, "param_variants": 2, "min_parent_variance": 0.0},
    })
    env = make_env(cfg.env)
    try:
        cur = build_curriculum(cfg, env=env, vocabulary_resets=1)
        seed = next(iter(cur.pool)).task
        cur.record(seed.task_id, [0, 1])
        (task,) = cur.generate()
    finally:
        env.close()
    assert task.kind == "param" and task.env == seed.env
    assert task.params != seed.params and set(task.params) == {"variation", "split", "simplifications"}
    assert task.instruction.startswith("Your task is to find")
    m = cur.metrics()
    assert m["generation_attempts_param"] == 2 and m["generation_accepted_param"] == 1
