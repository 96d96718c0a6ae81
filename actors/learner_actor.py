"""``LearnerActor``: the learner (``learner.learner.Learner``; GRPO, or PPO by ``learner.algorithm``) as a Ray actor.

It owns the policy's trainable copy and pushes new weights to the policy engines itself (the weights
never travel through the driver): ``sync(engines)`` builds the configured ``WeightSync`` (object store
on CPU, NCCL on GPU) over the engine handles and pushes ``Learner.sync_weights()`` at the learner's
version. Checkpoints go to ``<run>/checkpoints/step-NNNNNN`` (``learner.checkpoint``); the driver
writes its own state beside them.

Placement: ``learner.num_cpus`` / ``learner.num_gpus`` and, with ``train.colocate``, a bundle
of the placement group the policy engines share (same node).

With ``learner.data_parallel`` = N > 1 the actor is one rank of N (``actors.learner_group`` starts them):
it builds its ``Learner`` only in ``join``, once the ``torch.distributed`` group has formed; rank 0 alone
syncs the engines, prunes checkpoints and tokenises gold episodes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from dreamgym.config import DreamGymConfig
from dreamgym.types import Group, Trajectory

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from learner.learner import Learner


class LearnerActor:
    """The actor class (``create_learner`` applies ``ray.remote`` with the configured resources)."""

    def __init__(self, cfg: dict[str, Any], checkpoint: str | None = None, rank: int = 0,
                 world_size: int = 1) -> None:
        import torch

        self.cfg = DreamGymConfig.model_validate(cfg)
        torch.set_num_threads(self.cfg.learner.threads)
        self.rank, self.world_size = rank, world_size
        self._checkpoint = checkpoint
        self.learner: Learner
        if world_size == 1:
            self._build()
        self._sync: Any = None
        self._bc: Any = None

    def _build(self) -> None:
        from learner.learner import Learner

        if self._checkpoint:
            self.learner = Learner.from_checkpoint(self.cfg.learner, self._checkpoint,
                                                   temperature=self.cfg.policy.temperature)
        else:
            self.learner = Learner.from_config(self.cfg)

    # -- the data-parallel group ---------------------------------------------------------------------
    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: ``(node IP, free port)`` where the group's store will listen."""
        from actors.weight_sync import learner_rendezvous

        return learner_rendezvous()

    def join(self, address: str, port: int) -> dict[str, Any]:
        """Join the group at ``address:port`` (bounded by ``learner.dist_timeout_s``), then build the learner."""
        from learner.data_parallel import backend_for, init_group
        from learner.learner import pick_device

        c = self.cfg.learner
        init_group(address, port, self.rank, self.world_size, backend_for(pick_device(c.device)), c.dist_timeout_s)
        self._build()
        return self.info()

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": self.learner.version.version, "device": self.learner.device,
                "model_path": str(self.learner.model_path), "rank": self.rank, "world_size": self.world_size,
                "gpu_ids": [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]}

    def sequence_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """``log pi(x_t | x_<t)`` of each sequence under the current weights (an engine's ``score`` after a sync
        must match it within the engine dtype's rounding)."""
        return self.learner.sequence_logprobs(sequences)

    def version(self) -> int:
        return self.learner.version.version

    def parameters(self) -> dict[str, Any]:
        """This rank's trainable parameters on the CPU (tests and debugging compare replicas with them)."""
        return {n: p.detach().cpu().clone() for n, p in self.learner.model.named_parameters() if p.requires_grad}

    # -- training ----------------------------------------------------------------------------------
    def step(self, groups: Sequence[Group]) -> dict[str, float]:
        """One learner step (``Learner.step``): GRPO, or PPO with its critic."""
        return self.learner.step(groups)

    def warm_start_step(self, trajectories: Sequence[Trajectory], lr: float) -> dict[str, float]:
        """One behaviour-cloning step on gold trajectories (``learner.bc``)."""
        from learner.bc import BehaviourCloning

        if self._bc is None:
            self._bc = BehaviourCloning(self.learner, lr)
        return self._bc.step(trajectories)

    def tokenise_gold(self, episodes: list[list[Any]]) -> list[Trajectory]:
        """Gold episodes (lists of transitions) as trajectories with the policy's token ids."""
        from learner.bc import tokenise_episode

        return [tokenise_episode(ep, self.learner.tokenizer, self.cfg.policy) for ep in episodes]

    def end_warm_start(self) -> int:
        """Drop the warm-start optimizer and count the cloned weights as a new version (engines must sync)."""
        from dreamgym.types import WeightVersion

        self._bc = None
        if self.world_size > 1:
            from learner.data_parallel import broadcast_params

            # Every rank cloned on the same batch; on a GPU that need not be bit-identical: rank 0's weights rule.
            broadcast_params(self.learner.model)
        v = self.learner.version
        self.learner.version = WeightVersion(version=v.version + 1, step=v.step)
        return self.learner.version.version

    # -- weights -------------------------------------------------------------------------------------
    def sync(self, engines: Sequence[ActorHandle]) -> dict[str, Any]:
        """Push the current weights to every engine; returns the sync report."""
        from actors.weight_sync import make_weight_sync

        if self._sync is None:  # the engines of a run do not change
            self._sync = make_weight_sync(self.cfg, engines)
        rep = self._sync.push(self.learner.sync_weights(), self.learner.version.version)
        return {"version": rep.version, "seconds": rep.seconds, "engines": len(rep.engines), "bytes": rep.num_bytes}

    # -- checkpoints -----------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> str:
        from learner.checkpoint import prune_checkpoints

        path = self.learner.save_checkpoint(directory)  # only rank 0 writes (full replicas: its state is all)
        if self.rank == 0:
            prune_checkpoints(Path(directory).parent, self.cfg.learner.keep_checkpoints)
        return str(path)

    def save_model(self, directory: str) -> str:
        """The current policy as a plain HF folder (what ``dreamgym sft`` writes)."""
        from learner.bc import save_policy

        return str(save_policy(self.learner, directory))


def create_learner(cfg: DreamGymConfig, checkpoint: str | Path | None = None,
                   placement: dict[str, Any] | None = None) -> ActorHandle:
    """Start the learner actor with ``learner.num_cpus`` / ``learner.num_gpus``; returns once it is built."""
    handle = start_learner_actor(cfg, checkpoint, placement)
    ray.get(handle.info.remote())
    return handle


def start_learner_actor(cfg: DreamGymConfig, checkpoint: str | Path | None = None,
                        placement: dict[str, Any] | None = None, rank: int = 0, world_size: int = 1) -> ActorHandle:
    """Start one learner actor (rank ``rank`` of ``world_size``) without waiting for it."""
    t = cfg.learner
    from dreamgym.models import hub_env

    env_vars = {"OMP_NUM_THREADS": str(t.threads), "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
                **hub_env(), "TOKENIZERS_PARALLELISM": "false"}
    opts: dict[str, Any] = {"num_cpus": t.num_cpus, "num_gpus": t.num_gpus,
                            "runtime_env": {"env_vars": env_vars}, "max_concurrency": 1}
    if placement:
        opts.update(placement)
    return ray.remote(LearnerActor).options(**opts).remote(cfg.model_dump(mode="json"),
                                                          str(checkpoint) if checkpoint else None, rank, world_size)
