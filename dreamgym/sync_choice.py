"""Which weight sync a layout gets (``learner.weight_sync``), decided in one pure function from where the policy
engines and the learner run. No Ray, no torch, no config import: the config's validator calls it to refuse an
explicit choice that cannot work, and ``actors.weight_sync.sync_backend`` to settle ``auto``."""

from __future__ import annotations

from dreamgym.errors import ConfigError


def choose_weight_sync(requested: str, engine_device: str, learner_device: str, learner_gpus: float,
                       engine_gpus: float) -> str:
    """``object_store`` or ``nccl`` for ``learner.weight_sync`` = ``requested``; an explicit choice that cannot
    work raises ``ConfigError`` saying why and what to set instead.

    ======================  ==========================  ===============  ==================
    policy engines          learner                     ``auto``         ``nccl``
    ======================  ==========================  ===============  ==================
    CPU                     any                         object_store     refused
    CUDA                    CPU, or no GPU reserved     object_store     refused
    CUDA, fractional GPU    fractional GPU (may share)  object_store     refused
    CUDA                    a GPU of its own            nccl             nccl
    ======================  ==========================  ===============  ==================

    ``object_store`` is always accepted. NCCL needs the learner (rank 0) and every engine worker on distinct CUDA
    devices: a learner with ``num_gpus`` below 1 and engines below 1 may be packed onto one GPU by Ray, and NCCL
    refuses two ranks on one device. (Same-device hand-over, CUDA IPC, is not built yet.)
    """
    if requested not in ("auto", "object_store", "nccl"):
        raise ConfigError(f"learner.weight_sync {requested!r}: use auto, object_store or nccl")
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
    if requested == "nccl" and why_not:
        raise ConfigError(f"learner.weight_sync 'nccl' cannot work: {why_not}. Use learner.weight_sync "
                          "'object_store' (or 'auto', which picks it here)")
    if requested == "auto":
        return "object_store" if why_not else "nccl"
    return requested
