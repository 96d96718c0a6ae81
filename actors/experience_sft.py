"""``ExperienceSFTRank``: the experience-model fine-tune (``train.experience_sft``) as Ray actors, one per learner rank.

``actors.train_setup.experience_sft`` fine-tunes the experience model on the offline data before the run's actors
start, with the learner's resources and rank count (``dreamgym.placement.experience_sft_plan``). With
``learner.data_parallel`` = N > 1 the N rank actors form a ``torch.distributed`` group as the learner's ranks do
(gloo on CPU, NCCL on CUDA; the store on rank 0's node, bounded by ``learner.dist_timeout_s``) and run
``learner.sft_experience.train_experience_model`` together: each rank its share of every batch, gradients summed
over the ranks (``learner.data_parallel``), rank 0 writes the model. With one rank: one actor, no group, the
single-process fine-tune.

Rank 0 also annotates the offline data (template rationales, or a teacher's) before the group forms, so the
other ranks neither repeat it nor wait in a rendezvous bounded by ``learner.dist_timeout_s`` while it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from dreamgym.config import DreamGymConfig


class ExperienceSFTRank:
    """One rank of the fine-tune (``start_sft_ranks`` applies ``ray.remote`` with the learner's resources)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: ``(node IP, free port)`` where the group's store will listen (as the learner's rank 0)."""
        from actors.weight_sync import learner_rendezvous

        return learner_rendezvous()

    def join(self, address: str, port: int, device: str, timeout_s: float) -> None:
        """Join the group at ``address:port`` (gloo, or NCCL for ``device`` cuda), bounded by ``timeout_s``."""
        from learner.data_parallel import backend_for, init_group

        init_group(address, port, self.rank, self.world_size, backend_for(device), timeout_s)

    def annotate(self, cfg: dict[str, Any], data: str, out: str) -> str:
        """Reasoning for the offline data (``experience_model.annotate``: a teacher's, else template rationales)."""
        from dreamgym.experience.annotate import annotate_file, annotator_from_config

        em = DreamGymConfig.model_validate(cfg).experience_model
        annotate_file(data, out, annotator_from_config(em.annotate, em.train.step_budget))
        return out

    def train(self, cfg: dict[str, Any], out: str, progress: str | None) -> dict[str, Any]:
        """This rank's part of the fine-tune; rank 0 appends each step's record to ``progress`` (JSON lines)."""
        from learner.sft_experience import train_experience_model

        def log(rec: dict[str, Any]) -> None:
            assert progress is not None
            with Path(progress).open("a") as f:
                f.write(json.dumps(rec) + "\n")

        return train_experience_model(DreamGymConfig.model_validate(cfg), out, log=log if progress else None)


@dataclass
class SFTRanks:
    """The rank actors of one fine-tune (rank ``i`` is ``handles[i]``) and the placement group they sit in."""

    handles: list[Any]
    groups: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def join(self, cfg: DreamGymConfig, address: str, port: int) -> list[ray.ObjectRef]:
        """Every rank's ``join`` of the group at rank 0's ``rendezvous`` address: wait on them all."""
        device, timeout = cfg.experience_model.train.device, cfg.learner.dist_timeout_s
        return [h.join.remote(address, port, device, timeout) for h in self.handles]

    def train(self, cfg: DreamGymConfig, out: Path, progress: Path) -> list[ray.ObjectRef]:
        """Every rank's ``train`` with the same config (put in the object store once); rank 0 logs."""
        c = ray.put(cfg.model_dump(mode="json"))
        return [h.train.remote(c, str(out), str(progress) if r == 0 else None) for r, h in enumerate(self.handles)]

    def kill(self) -> None:
        """End every rank and give its resources back (the run's actors start next)."""
        from actors.placement import remove_groups

        for h in self.handles:
            ray.kill(h)
        remove_groups(self.groups)


def start_sft_ranks(cfg: DreamGymConfig, log: Any = print) -> SFTRanks:
    """Start ``learner.data_parallel`` rank actors where ``experience_sft_plan`` puts them (without waiting)."""
    from actors.placement import actor_options, create_groups
    from dreamgym.models import hub_env
    from dreamgym.placement import experience_sft_plan

    plan = experience_sft_plan(cfg)
    groups = create_groups(plan, cfg.ray.resources_timeout_s, log)
    env_vars = {"OMP_NUM_THREADS": str(cfg.learner.threads), **hub_env(), "TOKENIZERS_PARALLELISM": "false"}
    handles = []
    n = len(plan.actors)
    for a in plan.actors:
        opts, _ = actor_options(a, groups)
        handles.append(ray.remote(ExperienceSFTRank).options(**opts, runtime_env={"env_vars": env_vars},
                                                             max_concurrency=1).remote(a.index, n))
    return SFTRanks(handles, groups)
