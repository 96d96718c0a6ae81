"""``CurriculumActor``: the curriculum of a run as one Ray actor.

Thin on purpose: the logic is ``dreamgym.curriculum.Curriculum``. The actor owns one real
environment of ``env.name`` (seed tasks, the task grammar's vocabulary, and resetting parameter
variants to check them) when the run trains in it; a synthetic-only run takes its seed tasks from the
offline data instead and a text generator for text variants: either a picklable ``generator``
(e.g. ``ClientTextGenerator`` over the experience model's Ray client) or a ``generator_factory`` called
inside the actor (for a generator that owns an engine or threads and cannot be pickled).

Per iteration the driver calls ``select`` (tasks for the GRPO groups), then ``step(groups)`` (records
each group's ``V_tau``, runs the generation round, returns the iteration's metrics). ``state_dict`` /
``load_state_dict`` resume it exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ray

from dreamgym.config import DreamGymConfig
from dreamgym.curriculum.build import build_curriculum
from dreamgym.curriculum.generator import TextGenerator
from dreamgym.envs.registry import make_env
from dreamgym.types import Group, Task

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from actors.files import ShippedFile


class CurriculumActor:
    """The actor class (``ray.remote`` is applied by ``create_curriculum_actor``)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        generator: TextGenerator | None = None,
        generator_factory: Callable[[], TextGenerator] | None = None,
        use_env: bool = True,
        state: dict[str, Any] | None = None,
        offline_data: ShippedFile | str | None = None,
    ) -> None:
        self.cfg = DreamGymConfig.model_validate(cfg)
        self.env = make_env(self.cfg.env) if use_env else None
        if generator is None and generator_factory is not None:
            generator = generator_factory()
        facts = None
        if self.env is None and offline_data is not None:
            from actors.files import ShippedFile, local_copy
            from dreamgym.data.task_facts import OfflineTaskFacts

            if isinstance(offline_data, ShippedFile):
                with local_copy(offline_data) as path:
                    facts = OfflineTaskFacts.from_parquet(path, env=self.cfg.env.name)
            else:
                facts = OfflineTaskFacts.from_parquet(offline_data, env=self.cfg.env.name)
        self.curriculum = build_curriculum(self.cfg, env=self.env, generator=generator, facts=facts)
        if state is not None:
            self.curriculum.load_state_dict(state)

    def info(self) -> dict[str, Any]:
        cur = self.curriculum
        return {"env": self.cfg.env.name, "iteration": cur.iteration, "pool_size": len(cur.pool),
                "text_variants": cur.generator is not None, "param_variants": cur.checker is not None}

    # -- one iteration -----------------------------------------------------------------------------
    def select(self, batch_size: int | None = None) -> list[Task]:
        return self.curriculum.select(batch_size)

    def update(self, groups: Sequence[Group]) -> None:
        self.curriculum.update(groups)

    def record(self, task_id: str, rewards: Sequence[float], successes: int | None = None) -> float:
        return self.curriculum.record(task_id, rewards, successes)

    def generate(self) -> list[Task]:
        return self.curriculum.generate()

    def end_iteration(self) -> dict[str, Any]:
        return self.curriculum.end_iteration()

    def step(self, groups: Sequence[Group]) -> dict[str, Any]:
        return self.curriculum.step(groups)

    # -- inspection and resume ---------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        return self.curriculum.metrics()

    def outcomes(self, last: int | None = None) -> list[dict[str, Any]]:
        return self.curriculum.outcomes(last)

    def pool(self) -> list[dict[str, Any]]:
        """Every task of the pool with its record (history, counters, parent, kind)."""
        return [r.to_dict() for r in self.curriculum.pool]

    def state_dict(self) -> dict[str, Any]:
        return self.curriculum.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curriculum.load_state_dict(state)

    def close(self) -> None:
        closer = getattr(self.curriculum.generator, "close", None)
        if closer is not None:
            closer()
        if self.env is not None:
            self.env.close()
            self.env = None


def create_curriculum_actor(
    cfg: DreamGymConfig,
    generator: TextGenerator | None = None,
    generator_factory: Callable[[], TextGenerator] | None = None,
    use_env: bool = True,
    state: dict[str, Any] | None = None,
    num_cpus: float = 0.25,
    name: str | None = None,
    runtime_env: dict[str, Any] | None = None,
    offline_data: ShippedFile | str | None = None,
) -> ActorHandle:
    """Start a ``CurriculumActor`` for ``cfg`` (a fraction of a CPU: it mostly waits). A generator
    that owns an engine needs its environment variables in ``runtime_env`` (``engine_env``). With
    ``use_env=False`` the seed tasks come from ``offline_data`` (or the task file): a ``ShippedFile`` (read on the
    actor's own node; ``dreamgym train``) or a path the actor's node can read."""
    opts: dict[str, Any] = {"num_cpus": num_cpus}
    if name:
        opts["name"] = name
    if runtime_env:
        opts["runtime_env"] = runtime_env
    cls = ray.remote(CurriculumActor).options(**opts)
    return cls.remote(cfg.model_dump(mode="json"), generator=generator, generator_factory=generator_factory,
                      use_env=use_env, state=state, offline_data=offline_data)
