"""Which weight sync a layout gets (``learner.weight_sync``), decided in one pure function from where the policy
engines and the learner run. No Ray, no torch, no config import: the config's validator calls it to refuse an
explicit choice that cannot work, and ``actors.weight_sync.sync_backend`` to settle ``auto``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dreamgym.errors import ConfigError

SYNC_BACKENDS = ("auto", "object_store", "nccl", "ipc")


@dataclass(frozen=True)
class Colocation:
    """What the one-GPU colocated layout (CUDA IPC) needs besides the devices; defaults: not colocated."""

    colocated: bool = False
    """``train.colocate``: the learner and the engines in one placement group."""
    engines: int = 1
    """``policy.num_engines``."""
    tensor_parallel_size: int = 1
    """``policy.engine.tensor_parallel_size``."""
    learner_ranks: int = 1
    """``learner.data_parallel``."""
    max_staleness: int = 0
    """``train.max_staleness``: rollouts that overlap the learner step would meet a sleeping engine."""


def choose_weight_sync(requested: str, engine_device: str, learner_device: str, learner_gpus: float,
                       engine_gpus: float, colocation: Colocation | None = None) -> str:
    """``object_store``, ``nccl`` or ``ipc`` for ``learner.weight_sync`` = ``requested``; an explicit choice that
    cannot work raises ``ConfigError`` saying why and what to set instead.

    ======================================  ==========================  ============  ========  ========
    policy engines                          learner                     ``auto``      ``nccl``  ``ipc``
    ======================================  ==========================  ============  ========  ========
    CPU                                     any                         object_store  refused   refused
    CUDA                                    CPU, or no GPU reserved     object_store  refused   refused
    CUDA, fractional GPU                    fractional GPU (may share)  object_store  refused   refused
    CUDA, one engine, fraction, colocated   the rest of the same GPU    ipc           refused   ipc
    CUDA                                    a GPU of its own            nccl          nccl      refused
    ======================================  ==========================  ============  ========  ========

    ``object_store`` is always accepted. NCCL needs the learner (rank 0) and every engine worker on distinct CUDA
    devices: a learner with ``num_gpus`` below 1 and engines below 1 may be packed onto one GPU by Ray, and NCCL
    refuses two ranks on one device. CUDA IPC is the opposite: one learner rank and one engine (tensor-parallel
    size 1) that share one GPU, which ``train.colocate`` guarantees by placing both in one bundle
    (``dreamgym.placement``); the engine sleeps during each learner step (``train.sleep_engines``), so rollouts
    may not overlap it (``train.max_staleness`` 0).
    """
    if requested not in SYNC_BACKENDS:
        raise ConfigError(f"learner.weight_sync {requested!r}: use {', '.join(SYNC_BACKENDS)}")
    c = colocation or Colocation()
    learner_has_gpu = learner_device != "cpu" and learner_gpus > 0
    may_share = learner_gpus < 1 and engine_gpus < 1
    why_not = None
    if engine_device != "cuda":
        why_not = f"the policy engines run on {engine_device!r} (NCCL sends to CUDA engines only)"
    elif learner_device == "cpu":
        why_not = "the learner has no GPU (learner.device 'cpu'); NCCL's rank 0 sends from a CUDA device"
    elif not learner_has_gpu:
        why_not = (f"the learner reserves no GPU (learner.device {learner_device!r}, learner.num_gpus 0), so it "
                   "would use whichever GPU it sees, an engine's included, and NCCL refuses two ranks on one device; "
                   "set learner.num_gpus 1")
    elif may_share:
        why_not = (f"the learner (learner.num_gpus {learner_gpus:g}) and the policy engines (policy.engine.num_gpus "
                   f"{engine_gpus:g}) ask for fractions of a GPU, so Ray may put them on one device, and NCCL refuses "
                   "two ranks on one device; give the learner or the engines whole GPUs (num_gpus 1)")
    ipc_why_not = _why_not_ipc(engine_device, learner_device, learner_gpus, engine_gpus, c)
    if requested == "nccl" and why_not:
        raise ConfigError(f"learner.weight_sync 'nccl' cannot work: {why_not}. Use learner.weight_sync "
                          "'object_store' (or 'auto', which picks it here)")
    if requested == "ipc" and ipc_why_not:
        raise ConfigError(f"learner.weight_sync 'ipc' (one GPU shared by the learner and the policy engine) cannot "
                          f"work: {ipc_why_not}. Use learner.weight_sync 'auto'")
    if requested == "auto":
        if ipc_why_not is None:
            return "ipc"
        return "object_store" if why_not else "nccl"
    return requested


def _why_not_ipc(engine_device: str, learner_device: str, learner_gpus: float, engine_gpus: float,
                 c: Colocation) -> str | None:
    """Why the one-GPU colocated layout does not apply (``None``: it does)."""
    if engine_device != "cuda" or learner_device == "cpu" or learner_gpus <= 0:
        return "CUDA IPC needs the policy engine and the learner on a CUDA GPU (policy.engine.device cuda, " \
               "learner.device cuda, learner.num_gpus > 0)"
    if not c.colocated:
        return "the learner and the engine share a GPU only with train.colocate true"
    if learner_gpus + engine_gpus > 1 + 1e-9:
        return (f"learner.num_gpus {learner_gpus:g} + policy.engine.num_gpus {engine_gpus:g} is more than one GPU; "
                "give them fractions of one (e.g. 0.5 each)")
    if c.engines != 1 or c.tensor_parallel_size != 1 or c.learner_ranks != 1:
        return (f"it hands the weights from one learner rank to one engine on the same GPU (policy.num_engines "
                f"{c.engines}, policy.engine.tensor_parallel_size {c.tensor_parallel_size}, learner.data_parallel "
                f"{c.learner_ranks}; all must be 1)")
    if c.max_staleness != 0:
        return (f"the engine sleeps during the learner step, so rollouts cannot overlap it (train.max_staleness "
                f"{c.max_staleness}; set 0)")
    return None


def weight_sync_of(cfg: Any) -> str:
    """``choose_weight_sync`` for a whole config (``DreamGymConfig``, duck-typed: this module imports no config)."""
    le, p, t = cfg.learner, cfg.policy, cfg.train
    return choose_weight_sync(le.weight_sync, p.engine.device, le.device, le.num_gpus, p.engine.num_gpus,
                              Colocation(t.colocate, p.num_engines, p.engine.tensor_parallel_size,
                                         le.data_parallel, t.max_staleness))


def sleeps_engines(cfg: Any) -> bool:
    """Whether the policy engines sleep during each learner step: ``train.sleep_engines``, or for ``None``, when
    the weights pass by CUDA IPC (the learner and the engine share one GPU)."""
    chosen = cfg.train.sleep_engines
    return bool(chosen) if chosen is not None else weight_sync_of(cfg) == "ipc"
