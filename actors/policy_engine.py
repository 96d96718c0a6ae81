"""``PolicyEngine``: a Ray actor owning one in-process vLLM engine that serves the policy.

It samples actions for agent turns (``act``) or raw prompts (``generate``) and returns, for every
reply, its token ids, their log-probs and the weight version that produced them; it scores fixed
token sequences (``score``); and it receives new weights, either from the Ray object store
(``load_weights``, CPU path) or by NCCL broadcast through vLLM's weight-transfer API
(``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update``, GPU path). The actor is thin: the engine logic is
``dreamgym.vllm_engine.VllmPolicy``.

CPU: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and ``OMP_NUM_THREADS`` go into the actor's
``runtime_env`` (Ray would set one thread). GPU: ``policy.engine.tensor_parallel_size`` GPUs per engine, in the
one-GPU bundles of its placement group (``dreamgym.placement``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from dreamgym.config import PolicyConfig
from dreamgym.types import ActionSample, AgentTurn
from dreamgym.vllm_engine import engine_env

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle


class PolicyEngine:
    """The actor class (wrapped with ``ray.remote`` by ``create_policy_engines``)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        engine_index: int = 0,
        model_path: str | None = None,
        weight_transfer_backend: str | None = None,
    ) -> None:
        from dreamgym.vllm_engine import VllmPolicy

        self.name = f"policy-engine-{engine_index}"
        self.cfg = PolicyConfig.model_validate(cfg)
        self.policy = VllmPolicy(self.cfg, engine_index, model_path, weight_transfer_backend=weight_transfer_backend)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": os.getpid(),
            "model_path": str(self.policy.model_path),
            "weight_version": self.policy.weight_version,
            "dtype": self.policy.dtype,
            "start_seconds": self.policy.start_seconds,
            "gpu_ids": [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])],
        }

    def weight_version(self) -> int:
        return self.policy.weight_version

    # -- sampling ----------------------------------------------------------------------------------
    def act(self, turns: Sequence[AgentTurn], n: int = 1, **kw: Any) -> list[list[ActionSample]]:
        return self.policy.act(turns, n=n, **kw)

    def generate(self, prompts: Sequence[Sequence[int]], n: int = 1, **kw: Any) -> list[list[ActionSample]]:
        return self.policy.generate(prompts, n=n, **kw)

    def prompt_ids(self, turn: AgentTurn) -> list[int]:
        return self.policy.turn_prompt_ids(turn)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.policy.score(sequences)

    # -- weights: object store (CPU) ----------------------------------------------------------------
    def load_weights(self, weights: dict[str, torch.Tensor] | list[tuple[str, torch.Tensor]], version: int) -> dict:
        """Load weights delivered through the object store (Ray resolves the reference before the call)."""
        return {"engine": self.name, **self.policy.load_weights(weights, version)}

    def param_checksum(self, name: str = "model.embed_tokens.weight") -> float:
        return self.policy.param_checksum(name)

    # -- weights: vLLM weight-transfer API (GPU, NCCL) ------------------------------------------------
    def init_weight_transfer_engine(self, init_info: dict[str, Any], timeout_s: float | None = None) -> None:
        """Join the learner's NCCL group (rank ``rank_offset`` + this engine's tensor-parallel rank).

        The rendezvous runs in a helper thread bounded by ``timeout_s``: a learner that never arrives must not
        keep this actor (one call at a time) blocked, or every rollout queued behind it stalls. On timeout the
        call raises naming this engine and the rendezvous; the engine keeps serving, and the helper thread,
        stuck in the rendezvous, ends with the actor.
        """
        import threading

        box: dict[str, Any] = {}

        def join() -> None:
            try:
                self.policy.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})
            except BaseException as e:  # surfaced to the caller below
                box["error"] = e

        t = threading.Thread(target=join, name=f"{self.name}-nccl-init", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError(
                f"{self.name}: NCCL weight-transfer rendezvous with {init_info.get('master_address')}:"
                f"{init_info.get('master_port')} (rank offset {init_info.get('rank_offset')}, world size "
                f"{init_info.get('world_size')}) did not complete within {timeout_s:g} s; is the learner's "
                "address reachable from this engine's node, and did every engine get its own ranks?"
            )
        if "error" in box:
            raise box["error"]

    def start_weight_update(self) -> None:
        self.policy.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.policy.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self, version: int | None = None) -> dict:
        self.policy.llm.collective_rpc("finish_weight_update")
        retied = bool(self.policy.llm.collective_rpc("dg_retie")[0])
        self.policy.llm.reset_prefix_cache()
        if version is not None:
            self.policy.weight_version = int(version)
        return {"engine": self.name, "version": self.policy.weight_version, "retied": retied}

    def shutdown_weight_transfer_engine(self) -> None:
        self.policy.llm.collective_rpc("shutdown_weight_transfer_engine")


def create_policy_engines(
    cfg: PolicyConfig,
    num_engines: int | None = None,
    model_path: str | Path | None = None,
    weight_transfer_backend: str | None = None,
    name_prefix: str | None = None,
    placements: Sequence[tuple[dict[str, Any], dict[str, str]]] | None = None,
    one_by_one: bool = False,
) -> list[ActorHandle]:
    """Start ``num_engines`` (default ``cfg.num_engines``) engine actors; returns once all are ready.

    ``one_by_one``: each engine starts once the one before is up (engines that may share a GPU,
    ``dreamgym.placement.shares_gpus``: vLLM's profiling would charge one engine's memory to the other).

    ``weight_transfer_backend="nccl"`` for the GPU weight sync (``actors.weight_sync.NcclWeightSync``).
    ``placements``: per engine, the Ray options and extra environment of ``actors.placement.actor_options``
    (its placement-group bundle); without them each engine asks for ``cfg.engine`` resources itself. The start
    is bounded by ``cfg.engine.start_timeout_s``; an engine not up by then is named in the error.
    """

    from actors.placement import start_or_kill

    count = num_engines or cfg.num_engines
    if cfg.engine.tensor_parallel_size > 1 and placements is None:
        raise ValueError("a tensor-parallel engine runs in its placement group's bundles: pass placements "
                         "(actors.placement.actor_options of dreamgym.placement.plan_placement)")
    if placements is not None and len(placements) != count:
        raise ValueError(f"{len(placements)} placements for {count} policy engines")
    env = engine_env(cfg.engine.device, cfg.engine.omp_threads)
    handles = []
    for i in range(count):
        env_i = dict(env)
        binds = cfg.engine.cpu_binds
        if cfg.engine.device == "cpu" and binds:
            env_i["VLLM_CPU_OMP_THREADS_BIND"] = binds[i % len(binds)]
        elif cfg.engine.device == "cpu" and count > 1:
            # vLLM's automatic binding pins every engine of a node to the same cores; let the OS place them.
            env_i["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        options: dict[str, Any] = {"num_cpus": cfg.engine.num_cpus, "max_concurrency": 1}
        if cfg.engine.device == "cuda":
            options["num_gpus"] = cfg.engine.gpus()
        if placements is not None:
            placed, extra_env = placements[i]
            options.update(placed)
            env_i.update(extra_env)
        if cfg.engine.resources and "scheduling_strategy" not in options:  # custom resources: outside a group only
            options["resources"] = dict(cfg.engine.resources)
        options["runtime_env"] = {"env_vars": env_i}
        if name_prefix:
            options["name"] = f"{name_prefix}-{i}"
        actor_cls = ray.remote(PolicyEngine).options(**options)
        handles.append(
            actor_cls.remote(cfg.model_dump(mode="json"), i, str(model_path) if model_path else None,
                             weight_transfer_backend)
        )
        if one_by_one:
            start_or_kill(handles, {handles[-1].info.remote(): f"policy-engine-{i}"}, cfg.engine.start_timeout_s,
                          "policy.engine.start_timeout_s")
    return start_or_kill(handles, {h.info.remote(): f"policy-engine-{i}" for i, h in enumerate(handles)},
                         cfg.engine.start_timeout_s, "policy.engine.start_timeout_s")
