"""``LearnerGroup``: N data-parallel learner actors behind the one handle the driver already uses.

``learner.data_parallel`` = N > 1 starts N ``LearnerActor`` ranks, forms their ``torch.distributed`` group
(gloo on CPU, NCCL on CUDA; the store listens on rank 0's node IP and a free port there; forming it is
bounded by ``learner.dist_timeout_s``) and builds a full model replica on every rank (DDP-style, not sharded:
simple, and every rank can serve as rank 0's stand-in for checkpoints). See ``learner.data_parallel`` for
why a step on N ranks equals the single-actor step.

The group answers ``group.method.remote(...)`` like an actor handle, so ``ray.get`` in the driver is
unchanged:

- collective methods (``step``, ``save_checkpoint``, ``warm_start_step``, ``end_warm_start``) run on every
  rank with the same arguments (put in the object store once); the returned reference resolves to rank 0's
  result once every rank has finished, and fails with the first rank's error (a dead rank reads as a dead
  actor, as with one learner);
- rank-0 methods (``sync``, ``version``, ``info``, ``tokenise_gold``, ``save_model``) go to rank 0 only:
  it alone pushes weights to the engines and writes files (the replicas are equal).

With N = 1, ``create_learner_group`` returns the plain actor handle: nothing changes for one learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from actors.learner_actor import create_learner, start_learner_actor
from dreamgym.config import DreamGymConfig

#: Methods every rank runs (they touch the weights or the optimizer, or need every rank in a collective).
COLLECTIVE = frozenset({"step", "save_checkpoint", "warm_start_step", "end_warm_start"})
#: Methods only rank 0 runs (reads, engine sync, files).
RANK0 = frozenset({"sync", "version", "info", "tokenise_gold", "save_model"})


@ray.remote(num_cpus=0, max_retries=0)
def _rank0_result(*results: Any) -> Any:
    """Resolves once every rank's result is in (Ray resolves the arguments; a failed one fails this task)."""
    return results[0]


class _Method:
    """``group.<name>``: ``.remote(*args)`` like an actor method."""

    def __init__(self, handles: Sequence[Any], name: str) -> None:
        self._handles, self._name = handles, name

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        if self._name in RANK0:
            return getattr(self._handles[0], self._name).remote(*args, **kwargs)
        # One copy of the batch in the object store, not one serialisation per rank.
        args_refs = [ray.put(a) for a in args]
        kw_refs = {k: ray.put(v) for k, v in kwargs.items()}
        refs = [getattr(h, self._name).remote(*args_refs, **kw_refs) for h in self._handles]
        return _rank0_result.remote(*refs)


class LearnerGroup:
    """N learner actors (rank ``i`` is ``handles[i]``) in one data-parallel group."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = list(handles)

    def __getattr__(self, name: str) -> _Method:
        if name in COLLECTIVE or name in RANK0:
            return _Method(self.handles, name)
        raise AttributeError(f"LearnerGroup has no method {name!r} (collective: {sorted(COLLECTIVE)}; "
                             f"rank 0: {sorted(RANK0)})")

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def kill(self) -> None:
        for h in self.handles:
            ray.kill(h)


def learner_handles(learner: Any) -> list[Any]:
    """The actor handles behind a learner (a ``LearnerGroup``'s ranks, or the one handle)."""
    if learner is None:
        return []
    return list(learner.handles) if isinstance(learner, LearnerGroup) else [learner]


def create_learner_group(cfg: DreamGymConfig, checkpoint: str | Path | None = None,
                         placements: Sequence[dict[str, Any] | None] | None = None) -> Any:
    """Start ``learner.data_parallel`` learner actors in one group; returns once every rank is built.

    ``placements[i]``: Ray options (e.g. ``scheduling_strategy``) of rank ``i``. Resuming from ``checkpoint``
    loads it on every rank. One rank: the plain actor handle (``create_learner``).
    """
    n = cfg.learner.data_parallel
    places = list(placements) if placements else [None] * n
    if len(places) != n:
        raise ValueError(f"{len(places)} learner placements for learner.data_parallel = {n}")
    if n == 1:
        return create_learner(cfg, checkpoint, places[0])
    handles = [start_learner_actor(cfg, checkpoint, places[r], rank=r, world_size=n) for r in range(n)]
    try:
        address, port = ray.get(handles[0].rendezvous.remote())
        _wait_ranks([h.join.remote(address, port) for h in handles])
    except BaseException:
        for h in handles:
            ray.kill(h)
        raise
    return LearnerGroup(handles)


def _wait_ranks(refs: list[ray.ObjectRef]) -> None:
    """Every rank's ``join``, surfacing the first failure as soon as it happens (the others then fail at the
    group's bounded rendezvous instead of being waited for)."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
