"""``CurriculumActor`` inside a real local Ray cluster: selection, updates, generation (real
parameter variants checked in TextWorldExpress, text variants through the experience-model client
seam), metrics, and resume from ``state_dict`` into a new actor."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest

from actors.curriculum import create_curriculum_actor
from dreamgym.config import load_config
from dreamgym.curriculum import REJECT_REASONS, ClientTextGenerator
from dreamgym.experience.client import FunctionClient
from dreamgym.types import Group, Task, Trajectory


def _generator() -> ClientTextGenerator:
    def reply(messages: list[dict[str, str]], sampling: Any) -> str:
        import hashlib
        import random as _random

        text = messages[-1]["content"]
        if "Candidate new tasks" in text:
            return "Choice: 1"
        rng = _random.Random(hashlib.sha1(text.encode()).hexdigest())
        room = rng.choice(["kitchen", "pantry", "corridor", "bedroom", "backyard"])
        return f"Task: Search the {room} first, then find the coin, take it and look around."

    return ClientTextGenerator(FunctionClient(reply))


def _groups(batch: list[Task], rng: random.Random) -> list[Group]:
    out = []
    for t in batch:
        p = 0.5 if t.origin == "generated" else (int(t.params["seed"]) % 4) / 3  # 0, 1/3, 2/3, 1
        out.append(Group(t, [Trajectory(t, [], success=s, total_reward=float(s))
                             for s in (rng.random() < p for _ in range(8))]))
    return out


def test_curriculum_actor_in_local_ray(ray_cluster: Any) -> None:
    ray = ray_cluster
    # A step budget no coin plan comes near: the engine's expert walks are random (the shortest of several is
    # the plan), so a budget close to a plan's length would let the feasibility verdict, not the curriculum,
    # decide which variant each actor accepts.
    cfg = load_config(overrides={
        "env": {"name": "twx:coin", "max_steps": 60},
        "curriculum": {"seed_tasks": 8, "tasks_per_iteration": 4, "generated_fraction": 0.5,
                       "llm_variants": 2, "param_variants": 2, "parents_per_iteration": 2},
    })
    actor = create_curriculum_actor(cfg, generator=_generator())
    restored = None
    try:
        info = ray.get(actor.info.remote(), timeout=120)
        assert info["pool_size"] == 8 and info["text_variants"] and info["param_variants"]
        rng = random.Random(0)
        history = []
        for _ in range(4):
            batch = ray.get(actor.select.remote())
            assert sum(t.origin == "generated" for t in batch) <= 2
            metrics = ray.get(actor.step.remote(_groups(batch, rng)))
            assert metrics["selected_task_ids"] == [t.task_id for t in batch]
            assert metrics["groups"] == len(batch)
            history.append(metrics)
        generated = [tid for m in history for tid in m["generated_task_ids"]]
        assert generated, history
        last = history[-1]
        assert last["pool_size"] == 8 + len(generated) == last["pool_seed"] + last["pool_generated"]
        assert last["pool_generated_param"] > 0 and last["pool_generated_llm"] > 0
        assert sum(last["variance_histogram"].values()) == last["pool_tried"]
        for m in history:
            assert m["generation_attempts"] == m["generation_accepted"] + m["generation_rejected"]
            assert set(m["rejected"]) <= set(REJECT_REASONS)
        assert any(m["selected_generated"] > 0 for m in history)

        # resume: a new actor started from the state continues exactly like the original
        state = ray.get(actor.state_dict.remote())
        restored = create_curriculum_actor(cfg, generator=_generator(), state=state)
        assert ray.get(restored.state_dict.remote()) == state
        a, b = ray.get([actor.select.remote(), restored.select.remote()])
        assert a == b
        groups = _groups(a, random.Random(5))
        ma, mb = ray.get([actor.step.remote(groups), restored.step.remote(groups)])
        assert ma == mb
        assert ray.get(actor.pool.remote()) == ray.get(restored.pool.remote())
    finally:
        for h in (actor, restored):
            if h is not None:
                ray.get(h.close.remote())
                ray.kill(h)


@pytest.mark.slow
@pytest.mark.engine
def test_curriculum_actor_with_a_vllm_experience_model(ray_cluster: Any, tmp_path: Path) -> None:
    """The actor builds a real vLLM engine (a tiny random Llama) inside itself and generates text
    variants through the experience-model client seam. A random model writes garbage, so the checks
    are the bookkeeping: every reply is accepted after validation or rejected with a recorded reason,
    and the lambda cap holds in every batch while real parameter variants fill the pool past it."""
    from dreamgym.curriculum.generator import engine_generator
    from dreamgym.experience.engine import EngineOptions, engine_env
    from dreamgym.models import build_tiny_model

    ray = ray_cluster
    opts = EngineOptions(model=str(build_tiny_model(tmp_path / "tiny")), dtype="float32", max_model_len=2048,
                         seed=0, kv_cache_gib=1, omp_threads=2)
    cfg = load_config(overrides={
        "env": {"name": "twx:coin"},
        "curriculum": {"seed_tasks": 6, "tasks_per_iteration": 4, "generated_fraction": 0.25,
                       "llm_variants": 3, "param_variants": 2, "parents_per_iteration": 2,
                       "min_parent_variance": 0.0, "generation_max_tokens": 32},
    })
    actor = create_curriculum_actor(cfg, generator_factory=functools.partial(engine_generator, opts),
                                    runtime_env={"env_vars": engine_env(opts)})
    rng = random.Random(1)
    history = []
    try:
        ray.get(actor.info.remote(), timeout=300)
        for _ in range(4):
            batch = ray.get(actor.select.remote())
            assert sum(t.origin == "generated" for t in batch) <= 1  # floor(0.25 * 4)
            history.append(ray.get(actor.step.remote(_groups(batch, rng))))
        outcomes = ray.get(actor.outcomes.remote())
        pool = ray.get(actor.pool.remote())
    finally:
        ray.get(actor.close.remote())
        ray.kill(actor)

    llm = [o for o in outcomes if o["kind"] == "llm"]
    attempts = sum(m["generation_attempts_llm"] for m in history)
    assert attempts == 4 * 2 * 3  # 4 rounds x 2 parents x m = 3
    assert len(llm) == attempts  # one outcome per reply
    for o in llm:
        assert o["accepted"] or (o["reason"] in REJECT_REASONS and o["detail"]), o
    assert sum(m["generation_accepted_llm"] for m in history) == sum(o["accepted"] for o in llm)
    for m in history:
        assert m["generation_attempts"] == m["generation_accepted"] + m["generation_rejected"]
        assert m["selected_generated"] <= m["generated_cap"] == 1
    assert sum(r["task"]["kind"] == "param" for r in pool) > 1  # more generated tasks than the cap admits
    assert max(m["selected_generated"] for m in history) == 1
