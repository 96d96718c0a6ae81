"""Building the experience-model pieces from the typed config (``experience_model`` section)."""

from __future__ import annotations

from dreamgym.config import ExperienceModelConfig
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.engine import EngineOptions
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.prompts import PromptOptions
from dreamgym.experience.retry import RetryPolicy
from dreamgym.experience.schema import Sampling


def prompt_options(cfg: ExperienceModelConfig, state_max_chars: int = 2_000) -> PromptOptions:
    return PromptOptions(
        history_steps=cfg.history_steps, top_k=cfg.top_k, demo_state_max_chars=cfg.demo_state_max_chars,
        history_state_max_chars=cfg.history_state_max_chars, state_max_chars=state_max_chars,
        reasoning=cfg.reasoning, reward_min=cfg.reward_min, reward_max=cfg.reward_max,
    )


def sampling(cfg: ExperienceModelConfig) -> Sampling:
    return Sampling(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)


def retry_policy(cfg: ExperienceModelConfig) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=cfg.max_attempts, temperature_decay=cfg.retry_temperature_decay,
        escape_temperature=cfg.retry_escape_temperature, max_tokens_cap=cfg.max_tokens_cap,
    )


def engine_options(cfg: ExperienceModelConfig, model_path: str, index: int = 0) -> EngineOptions:
    """Engine options of replica ``index``: its CPU binding is ``cpu_binds[index % len]``, ``nobind``
    when none is given (vLLM's automatic binding pins every engine of a node to the same cores, and a
    pinned engine cannot move off a core that other processes keep busy)."""
    e = cfg.engine
    bind = e.cpu_binds[index % len(e.cpu_binds)] if e.cpu_binds else "nobind"
    return EngineOptions(
        model=model_path, dtype=e.resolved_dtype(), max_model_len=e.max_model_len, prefix_caching=e.prefix_caching,
        enforce_eager=e.enforce_eager, seed=e.seed + index, kv_cache_gib=e.kv_cache_gib,
        omp_threads=e.omp_threads, cpu_bind=bind, device=e.device, gpu_memory_utilization=e.gpu_memory_utilization,
        tensor_parallel_size=e.tensor_parallel_size, speculative_tokens=cfg.speculative_tokens,
    )


def build_model(cfg: ExperienceModelConfig, client: ExperienceClient, state_max_chars: int = 2_000) -> ExperienceModel:
    """An ``ExperienceModel`` over ``client`` with the config's prompt, sampling and retry policy."""
    return ExperienceModel(client, prompt_options(cfg, state_max_chars), sampling(cfg), retry_policy(cfg),
                           inadmissible=cfg.inadmissible, check_reward_rule=cfg.check_reward_rule)
