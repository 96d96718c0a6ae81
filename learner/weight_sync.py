"""Weight sync: how policy engines get the learner's new weights after each step.

The seam is one small ABC, ``WeightSync.push(weights, version)``: when it returns, every engine
serves ``version`` and every sample it produces from then on carries that version. A push that
fails or does not finish within its timeout raises ``WeightSyncError`` naming the engine(s) and
the version; it never hangs. A load that missed the timeout is not cancelled: an engine may still
finish it later, and from then on serves (and tags its samples with) that version.

Implementations:

- ``InProcessWeightSync`` (here): engines in this process (``dreamgym.vllm_engine.VllmPolicy``);
  tensors go straight into vLLM's in-place reload. For scripts, benchmarks and tests without Ray.
- ``actors.weight_sync.ObjectStoreWeightSync`` (CPU): one ``ray.put`` of the tensors, every engine
  actor loads them from the object store into vLLM's in-place reload.
- ``actors.weight_sync.NcclWeightSync`` (GPU): NCCL broadcast from the learner's GPU into every
  engine through vLLM's weight-transfer API (``NCCLTrainerWeightTransferEngine``).

The learner hands over checkpoint-format ``(HF name, tensor)`` pairs (``Learner.sync_weights()``:
LoRA adapters already merged); each implementation casts to the engines' dtype.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from dreamgym.vllm_engine import VllmPolicy

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]


class WeightSyncError(RuntimeError):
    """A weight push failed or timed out on at least one engine."""

    def __init__(self, engines: Sequence[str], version: int, reason: str) -> None:
        self.engines = list(engines)
        self.version = version
        self.reason = reason
        super().__init__(f"weight sync of version {version} failed on {', '.join(self.engines)}: {reason}")


@dataclass
class SyncReport:
    """What one push did."""

    version: int
    seconds: float
    engines: list[str]
    num_tensors: int
    num_bytes: int
    details: list[dict] = field(default_factory=list)
    """Per-engine summaries returned by the engines (load time, re-tied head, ...)."""


class WeightSync(ABC):
    """Deliver the learner's weights at ``version`` to every policy engine."""

    @abstractmethod
    def push(self, weights: NamedTensors, version: int) -> SyncReport:
        """Block until every engine serves ``version``; raise ``WeightSyncError`` otherwise."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release transport resources (process groups, buffers)."""


def cast_for_engine(weights: NamedTensors, dtype: str, clone: bool) -> list[tuple[str, torch.Tensor]]:
    """Detached, contiguous CPU copies (or views when ``clone`` is False and no cast is needed).

    A tied ``lm_head.weight`` (the embedding tensor itself) is left out: it would be moved twice,
    and ``VllmPolicy.load_weights`` restores it from the embedding for tied models.
    """
    from dreamgym.dtypes import torch_dtype

    target = torch_dtype(dtype)
    out = []
    pairs = list(weights)
    embed = dict(pairs).get("model.embed_tokens.weight")
    for name, t in pairs:
        if name == "lm_head.weight" and embed is not None and t.data_ptr() == embed.data_ptr():
            continue
        t = t.detach()
        if t.device.type != "cpu" or t.dtype != target or clone:
            t = t.to(device="cpu", dtype=target, copy=True)
        out.append((name, t.contiguous()))
    return out


class InProcessWeightSync(WeightSync):
    """Engines living in this process: the tensors are copied once and loaded by each engine."""

    def __init__(self, engines: Sequence[VllmPolicy], dtype: str = "float32", timeout_s: float = 300.0) -> None:
        self.engines = list(engines)
        self.dtype = dtype
        self.timeout_s = timeout_s

    def push(self, weights: NamedTensors, version: int) -> SyncReport:
        t0 = time.perf_counter()
        pairs = cast_for_engine(weights, self.dtype, clone=True)
        details = []
        # A worker thread enforces the timeout (vLLM's engine is not thread-safe, so engines load one
        # by one); on timeout the thread is abandoned, not joined, so the caller gets the error at once.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync")
        try:
            for i, engine in enumerate(self.engines):
                name = f"in-process-engine-{i}"
                fut = pool.submit(engine.load_weights, pairs, version)
                try:
                    details.append(fut.result(timeout=max(0.0, self.timeout_s - (time.perf_counter() - t0))))
                except FutureTimeout:
                    raise WeightSyncError([name], version, f"timed out after {self.timeout_s:.1f} s") from None
                except Exception as e:
                    raise WeightSyncError([name], version, f"{type(e).__name__}: {e}") from e
        finally:
            pool.shutdown(wait=False)
        return SyncReport(
            version=version,
            seconds=time.perf_counter() - t0,
            engines=[f"in-process-engine-{i}" for i in range(len(self.engines))],
            num_tensors=len(pairs),
            num_bytes=sum(t.numel() * t.element_size() for _, t in pairs),
            details=details,
        )
