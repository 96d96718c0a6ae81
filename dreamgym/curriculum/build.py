"""Building a ``Curriculum`` from the run config: seed tasks, the environment's task grammar, the
real-environment checker for parameter variants, and the text generator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dreamgym.curriculum.curriculum import Curriculum
from dreamgym.curriculum.generator import TextGenerator
from dreamgym.curriculum.grammar import TaskGrammar, environment_vocabulary
from dreamgym.curriculum.param_variants import EnvChecker, has_param_variants
from dreamgym.curriculum.taskfile import load_task_file
from dreamgym.data.task_facts import OfflineTaskFacts
from dreamgym.types import Task

if TYPE_CHECKING:
    from dreamgym.config import DreamGymConfig
    from dreamgym.envs.base import Environment


def seed_tasks(cfg: DreamGymConfig, env: Environment | None, facts: OfflineTaskFacts | None = None) -> list[Task]:
    """The task file's tasks; else ``curriculum.seed_tasks`` tasks of the environment's split; else, with no
    real environment, the first ``curriculum.seed_tasks`` tasks of the offline data (from the
    ``curriculum.first_seed``-th), each with its initial state."""
    c = cfg.curriculum
    if c.task_file is not None:
        return load_task_file(c.task_file, cfg.env.name)
    if env is not None:
        return env.tasks(c.seed_tasks, first=c.first_seed, split=cfg.env.split)
    if facts is not None:
        tasks = facts.tasks(c.seed_tasks, first=c.first_seed)
        if not tasks:
            raise ValueError(f"the offline data has no tasks of {cfg.env.name} from index {c.first_seed}: seed tasks "
                             "come from it when no real environment is opened (set curriculum.task_file, or "
                             "collect offline data of this environment)")
        return tasks
    raise ValueError("seed tasks come from the environment, the offline data or curriculum.task_file: pass one")


def world_of(env_spec: str) -> str:
    """How the prompts name the environment ("a TextWorldExpress text game", ...)."""
    try:
        from dreamgym.experience.templates import template_for

        return template_for(env_spec).world
    except ImportError:  # pragma: no cover - the experience package is part of the distribution
        return "a text environment"


def build_curriculum(
    cfg: DreamGymConfig,
    env: Environment | None = None,
    generator: TextGenerator | None = None,
    vocabulary_resets: int = 8,
    facts: OfflineTaskFacts | None = None,
) -> Curriculum:
    """A curriculum for ``cfg``. ``env`` (a real environment of ``cfg.env``) supplies seed tasks, the
    task grammar's vocabulary and the checks of parameter variants; without it, the seed tasks come from
    the offline data's ``facts`` (or the task file), the grammar knows only the seed instructions and no
    parameter variants are made."""
    tasks = seed_tasks(cfg, env, facts)
    c = cfg.curriculum
    vocab = environment_vocabulary(env, tasks, resets=vocabulary_resets) if env is not None else set()
    checker = EnvChecker(env) if env is not None and has_param_variants(env.spec) and c.param_variants else None
    return Curriculum(c, tasks, generator=generator, checker=checker,
                      grammar=TaskGrammar(vocab, min_known=c.min_known_words),
                      world=world_of(cfg.env.name), seed=cfg.run.seed)
