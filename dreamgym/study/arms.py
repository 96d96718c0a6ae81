"""The arms of ``dreamgym study`` and the config of one arm-seed.

Every arm is the study's config with a few fields changed, so all arms share the environment, the models,
the learner, the curriculum, the number of iterations (learner steps), the offline data and the held-out
evaluation seeds. What each arm changes (``ARM_SETTINGS``):

- ``base``: no training (``train.iterations 0``): the initial policy, evaluated once;
- ``real``: GRPO in the real environment (``train.mode real``), the paper's baseline;
- ``dreamgym``: GRPO in the experience model only (``train.mode synthetic``); no real transitions beyond the
  offline data;
- ``dreamgym-s2r``: ``train.mode s2r``: the first iterations in synthesis, the last ``s2r_real_iterations`` in
  the real environment within ``train.real_budget`` = ``s2r_budget_fraction`` x the real arm's real transitions;
- ``no-retrieval``: ``dreamgym`` with ``experience_model.top_k 0`` (no demonstrations, in serving and in SFT);
- ``no-reasoning``: ``dreamgym`` with ``experience_model.reasoning false`` (no ``<think>`` block, in serving and
  in SFT; ``dreamgym/experience/prompts.py``);
- ``no-task-generation``: ``dreamgym`` with ``curriculum.generate_every 0`` (seed tasks only);
- ``no-rules``: ``dreamgym`` with the rules off (``experience_model.check_reward_rule false``: no resampling of a
  reply whose reward breaks the family's rule; ``experience_model.inadmissible model``: every step goes to the
  model, none is settled by the admissible list). The rules still *count* what they would have refused or
  settled (``dreamgym.experience.accounting``): it controls for how much of DreamGym's result the rules make.

Two controls for the experience model itself (what a synthetic environment gives without a model that reasons,
and what the offline expert data gives without any RL):

- ``copy-sim``: ``dreamgym``'s synthetic environment (offline first states, the replay buffer's retrieval, the
  admissible and action-space checks, the reward rules) with ``experience_model.backend copy``: each step's next
  state, reward and done are the top-1 retrieved transition's (``dreamgym.experience.copy_client``); no model,
  no fine-tune, no LLM task variants. If DreamGym does no better, the model adds nothing over retrieval + rules;
- ``bc``: behaviour cloning on the offline data's expert (gold) episodes (``train.warm_start`` ``sft``, the GRPO
  learner's own code path: a supervised loss on the expert actions in the prompt form the policy sees) with as
  many learner steps as the other arms' ``train.iterations`` and as many episodes per step as a GRPO step
  (``curriculum.tasks_per_iteration`` x ``learner.group_size``), then no RL (``train.iterations 0``) and the same
  held-out evaluation. It controls for the expert data every synthetic arm learns from.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from dreamgym.config import STUDY_ARMS, DreamGymConfig, deep_merge, validate_config
from dreamgym.errors import ConfigError

#: What each arm changes in the study's config (nested like the config tree).
ARM_SETTINGS: dict[str, dict[str, Any]] = {
    "base": {"train": {"mode": "real", "iterations": 0, "seed_replay": False, "real_budget": None,
                       "eval": {"at_start": True}}},
    "real": {"train": {"mode": "real", "real_budget": None}},  # every iteration, however many transitions
    "dreamgym": {"train": {"mode": "synthetic"}},
    "dreamgym-s2r": {"train": {"mode": "s2r"}},  # synthetic_iterations and real_budget: ``arm_seed_config``
    "copy-sim": {"train": {"mode": "synthetic", "experience_sft": False},
                 "experience_model": {"backend": "copy"}, "curriculum": {"llm_variants": 0}},
    "bc": {"train": {"mode": "real", "iterations": 0, "seed_replay": False, "real_budget": None,
                     "eval": {"at_start": True}, "warm_start": {"method": "sft"}}},  # steps: ``arm_seed_config``
    "no-retrieval": {"train": {"mode": "synthetic"}, "experience_model": {"top_k": 0}},
    "no-reasoning": {"train": {"mode": "synthetic"}, "experience_model": {"reasoning": False}},
    "no-task-generation": {"train": {"mode": "synthetic"}, "curriculum": {"generate_every": 0}},
    "no-rules": {"train": {"mode": "synthetic"},
                 "experience_model": {"check_reward_rule": False, "inadmissible": "model"}},
}
assert tuple(ARM_SETTINGS) == STUDY_ARMS

#: One line per arm, for the table and the README.
ARM_LABELS: dict[str, str] = {
    "base": "base policy (no training)",
    "real": "GRPO in the real environment",
    "dreamgym": "DreamGym (synthetic only)",
    "dreamgym-s2r": "DreamGym-S2R (synthetic, then a small real budget)",
    "copy-sim": "copy-top-1 simulator (same env, rules and retrieval; no model)",
    "bc": "behaviour cloning on the offline expert episodes (no RL)",
    "no-retrieval": "DreamGym without retrieval (top_k 0)",
    "no-reasoning": "DreamGym without reasoning",
    "no-task-generation": "DreamGym without task generation",
    "no-rules": "DreamGym without rules (no resampling, no settling)",
}


def study_name(cfg: DreamGymConfig) -> str:
    return cfg.study.name or cfg.run.name


def study_dir_for(cfg: DreamGymConfig) -> Path:
    """``<run.out_dir>/study-<name>``."""
    return Path(cfg.run.out_dir) / f"study-{study_name(cfg)}"


def arm_seed_dir(study_dir: Path, arm: str, seed: int) -> Path:
    """The run directory of one arm-seed: ``<study>/<arm>/seed-<k>`` (a ``dreamgym train`` run directory)."""
    return study_dir / arm / f"seed-{seed}"


def s2r_real_iterations(cfg: DreamGymConfig) -> int:
    """Iterations of ``dreamgym-s2r`` in the real environment (the last ones of ``train.iterations``)."""
    st = cfg.study
    if st.s2r_real_iterations is not None:
        return st.s2r_real_iterations
    return max(1, round(st.s2r_budget_fraction * cfg.train.iterations))


def s2r_budget(cfg: DreamGymConfig, real_transitions: list[int]) -> tuple[int, str]:
    """``dreamgym-s2r``'s real budget and where it comes from: ``s2r_budget_fraction`` x the mean real transitions
    of the finished ``real`` runs, else ``study.s2r_real_budget``."""
    st = cfg.study
    if real_transitions:
        mean = sum(real_transitions) / len(real_transitions)
        budget = max(1, math.floor(st.s2r_budget_fraction * mean))
        return budget, (f"{st.s2r_budget_fraction:g} x the real arm's mean of {mean:.0f} real transitions "
                        f"({len(real_transitions)} run(s))")
    if st.s2r_real_budget is not None:
        return st.s2r_real_budget, "study.s2r_real_budget (no finished real run)"
    raise ConfigError("the dreamgym-s2r arm needs its real budget: run the real arm first (it runs before "
                      "dreamgym-s2r when both are in study.arms) or set study.s2r_real_budget")


def _expand_dotted(over: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in over.items():
        nested = _expand_dotted(value) if isinstance(value, dict) else value
        for part in reversed(key.split(".")):  # "learner.lr": 1e-5 -> {"learner": {"lr": 1e-5}}
            nested = {part: nested}
        out = deep_merge(out, nested)
    return out


def arm_seed_config(cfg: DreamGymConfig, arm: str, seed: int, offline: Path | None, *,
                    real_budget: int | None = None, experience_model: Path | None = None) -> DreamGymConfig:
    """The ``dreamgym train`` config of ``arm`` with training seed ``seed``.

    ``offline``: the study's offline data (every arm reads the same file); ``real_budget``: ``dreamgym-s2r``'s
    (placeholder 1 when only validating); ``experience_model``: an already fine-tuned experience model of the
    same variant to serve instead of fine-tuning again (``study.share_experience_model``)."""
    if arm not in ARM_SETTINGS:
        raise ConfigError(f"unknown study arm {arm!r}; arms: {', '.join(STUDY_ARMS)}")
    st = cfg.study
    data = cfg.model_dump(mode="json")
    common: dict[str, Any] = {
        "run": {"seed": seed, "name": f"{arm}-seed-{seed}"},
        "policy": {"engine": {"seed": seed}},
        "experience_model": {"engine": {"seed": seed}},
        "train": {"eval": {"at_start": st.eval_at_start}},
    }
    if offline is not None:
        common["train"]["offline_data"] = str(offline)
    if st.eval_episodes is not None:
        common["train"]["eval"].update(tasks=st.eval_episodes, episodes_per_task=1)
    data = deep_merge(data, common)
    data = deep_merge(data, ARM_SETTINGS[arm])
    if arm == "dreamgym-s2r":
        k = s2r_real_iterations(cfg)
        if k >= cfg.train.iterations:
            raise ConfigError(f"study arm dreamgym-s2r: {k} real iteration(s) leave no synthetic one of "
                              f"train.iterations {cfg.train.iterations}; raise train.iterations or lower "
                              "study.s2r_real_iterations")
        data = deep_merge(data, {"train": {"synthetic_iterations": cfg.train.iterations - k,
                                           "real_budget": real_budget or 1}})
    if arm == "bc":  # the same learner budget as the trained arms (their warm start, if any, and their iterations)
        ws = cfg.train.warm_start
        data = deep_merge(data, {"train": {"warm_start": {
            "steps": max(1, cfg.train.iterations + (ws.steps if ws.method == "sft" else 0)),
            "batch_episodes": cfg.curriculum.tasks_per_iteration * cfg.learner.group_size}}})
    data = deep_merge(data, _expand_dotted(st.overrides.get(arm, {})))
    if experience_model is not None:
        data = deep_merge(data, {"experience_model": {"model": str(experience_model)},
                                 "train": {"experience_sft": False}})
    try:
        return validate_config(data)
    except ConfigError as e:
        raise ConfigError(f"study arm {arm}, seed {seed}: {e}") from None


def fine_tunes_experience_model(cfg: DreamGymConfig) -> bool:
    """Whether ``dreamgym train`` with ``cfg`` fine-tunes the experience model before training."""
    t = cfg.train
    synthetic = t.mode == "synthetic" or (t.mode == "s2r" and t.synthetic_iterations > 0)
    return t.experience_sft and synthetic and cfg.experience_model.backend == "ray"


def experience_variant(cfg: DreamGymConfig) -> str:
    """A key of everything the experience-model fine-tune depends on (its settings, the environment, the offline
    data); arm-seeds with the same key can serve one fine-tuned model. The training seed is left out on purpose:
    the paper trains its experience model once."""
    em = cfg.experience_model.model_dump(mode="json")
    em.pop("engine", None)  # how it is served, not what it learns
    key = {"experience_model": em, "env": cfg.env.model_dump(mode="json"),
           "offline": str(cfg.train.offline_data), "replay_encoder": str(cfg.replay.encoder),
           "learner_threads": cfg.learner.threads}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
