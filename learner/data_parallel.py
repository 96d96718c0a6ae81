"""Data parallelism for the learner and the experience-model fine-tune: N ranks, full model replicas, one
``torch.distributed`` group.

``learner.data_parallel`` = N learner processes join one group (gloo on CPU, NCCL on CUDA). Every rank
builds the same batch from the same groups (sequences, advantages and the aggregation weights ``w_t``
over the *whole* batch or mini-batch), then runs forward/backward on a disjoint share of its sequences.
The loss is ``sum_t w_t * l_t`` with weights already normalised over the whole (mini-)batch
(``dreamgym.grpo.token_weights``), so the sum of the ranks' losses is exactly the single-process loss
and **summing** the ranks' gradients (not averaging) gives exactly its gradient, whatever the token
counts of the shares. The optimizer then steps on identical gradients on every rank, so the replicas
stay equal without broadcasting weights.

Why a manual all-reduce instead of ``DistributedDataParallel``: ranks may run different numbers of
micro-batches (shares are balanced by tokens, not by count; a rank may even get none), and DDP's
per-backward hooks need every rank to run the same backward passes. One bucketed all-reduce after the
accumulation has no such constraint. No Ray here: the caller (``actors.learner_group``,
``actors.experience_sft``) starts the processes and hands every rank the rendezvous address.

The experience-model fine-tune (``learner.sft_experience``) steps the same way: its loss is summed over the
reply tokens and divided by the whole step batch's reply-token count, so each rank's share of a batch
(``shard``) carries its part of that mean and the summed gradients are the single process's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Elements per all-reduce bucket (fp32: 64 MiB): bounds the extra memory of the flattened gradients.
BUCKET_NUMEL = 16 * 1024 * 1024


def backend_for(device: str) -> str:
    """``nccl`` for a CUDA learner, ``gloo`` otherwise."""
    return "nccl" if device.startswith("cuda") else "gloo"


def init_group(address: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    """Join the learner's process group at ``address:port`` (rank 0 hosts the store); bounded by ``timeout_s``.

    Raises ``RuntimeError`` naming the address, rank and timeout when the group does not form in time (a
    rank that never started, a firewall between nodes, a port taken meanwhile).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() == world_size and dist.get_rank() == rank:
            return
        raise RuntimeError(f"this process is already rank {dist.get_rank()} of {dist.get_world_size()}, "
                           f"not rank {rank} of {world_size}")
    try:
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
    except Exception as e:
        raise RuntimeError(f"learner rank {rank}/{world_size}: the {backend} group at {address}:{port} did not form "
                           f"within learner.dist_timeout_s = {timeout_s:g} s ({type(e).__name__}: {e})") from e


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process (``(0, 1)`` without a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def shard(lengths: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Indices of the items (sequence lengths ``lengths``) that are ``rank``'s share, balanced by tokens.

    Longest first, each to the rank with the fewest tokens so far (ties: the lowest rank): deterministic, so
    every rank computes the same partition from the same batch without talking. Indices come back in their
    original order, so micro-batching inside a share sees the batch's order.
    """
    loads = [0] * world_size
    owner = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda k: (loads[k], k))
        owner[i] = r
        loads[r] += lengths[i]
    return [i for i in range(len(lengths)) if owner[i] == rank]


def all_reduce_grads(params: Sequence[torch.Tensor]) -> None:
    """Sum every parameter's gradient over the ranks (in place), in flat buckets of at most ``BUCKET_NUMEL``.

    A rank whose share was empty has no gradients yet: it contributes zeros (and ends with the sum too).
    """
    import torch

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        bucket.append(g)
        size += g.numel()
        if size >= BUCKET_NUMEL:
            _reduce_bucket(bucket)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket)


def _reduce_bucket(bucket: list[torch.Tensor]) -> None:
    import torch
    import torch.distributed as dist

    if len(bucket) == 1:
        dist.all_reduce(bucket[0])
        return
    flat = torch.cat([g.reshape(-1) for g in bucket])
    dist.all_reduce(flat)
    offset = 0
    for g in bucket:
        n = g.numel()
        g.copy_(flat[offset: offset + n].view_as(g))
        offset += n


def all_reduce_floats(values: dict[str, float], device: str, op: str = "sum") -> dict[str, float]:
    """``values`` summed (or maxed: ``op='max'``) over the ranks, in one collective (fp64, for exact counts)."""
    import torch
    import torch.distributed as dist

    if not values:
        return {}
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist(), strict=True))


def broadcast_params(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (after building or loading a replica, and
    after anything that might not be bit-identical across ranks, e.g. a warm start on a GPU)."""
    broadcast_tensors([*module.parameters(), *module.buffers()], src)


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Copy rank ``src``'s ``tensors`` to every rank, in place (e.g. only the trainable ones: LoRA adapters
    initialised at random over a frozen base every rank loaded from the same files)."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (picklable) on every rank: what each rank built for itself, made identical."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src)
    return box[0]
