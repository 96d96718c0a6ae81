"""Weight sync to ``PolicyEngine`` actors (the Ray implementations of ``learner.weight_sync.WeightSync``).

``ObjectStoreWeightSync`` (CPU): the learner's tensors, cast to the engines' dtype, go into the Ray
object store once (``ray.put``; zero-copy for torch tensors with
``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1`` set before Ray is imported); every engine actor gets the
reference, Ray resolves it in the actor's process and the engine loads the tensors in place.

``IpcWeightSync`` (one GPU shared by the learner and the engine, marked gpu): the same protocol with vLLM's CUDA IPC
engine; the learner's tensors are shared by handle, not copied.

``NcclWeightSync`` (GPU, marked gpu, not runnable on a CPU machine): vLLM's own trainer-side NCCL
engine (``NCCLTrainerWeightTransferEngine``) broadcasts from the learner's GPU (rank 0) to every
engine's tensor-parallel workers while the engines receive through ``update_weights``; the engine actors
expose vLLM's start/update/finish weight-transfer calls. Ranks come from ``dreamgym.placement.NcclRanks``
(engine ``i``, worker ``j`` -> ``1 + i * t + j``): vLLM's trainer sends every engine the same
``rank_offset`` 1, so ``_EngineClient`` rewrites it per engine. The rendezvous is the learner's node address
and a port free there (``learner_rendezvous``, called in the learner actor), and every step of it is bounded:
the engine side by its own timeout (a failed init must not block the engine actor) and the learner side by
``learner.sync_timeout_s``.

Both wait for all engines with a deadline: an engine that raises or does not answer in time
makes ``push`` raise ``WeightSyncError`` with the engine's name and the version.
"""

from __future__ import annotations

import functools
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import ray

from learner.weight_sync import NamedTensors, SyncReport, WeightSync, WeightSyncError, cast_for_engine

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle

    from dreamgym.config import DreamGymConfig
    from dreamgym.placement import NcclRanks


def _engine_names(engines: Sequence[ActorHandle]) -> list[str]:
    return [f"policy-engine-{i}" for i in range(len(engines))]


def _wait_all(refs: dict[Any, str], version: int, timeout_s: float, budget_s: float | None = None) -> list[Any]:
    """``ray.get`` every ref within ``timeout_s``; raise ``WeightSyncError`` naming the culprits.

    ``budget_s`` is the configured timeout quoted in the error (``timeout_s`` may be what is left of it).
    """
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=max(0.0, timeout_s))
    results = []
    failed: list[tuple[str, str]] = []
    for r in ready:
        try:
            results.append(ray.get(r))
        except Exception as e:  # the engine raised while loading; report the engine's own exception
            cause = getattr(e, "cause", None) or e
            failed.append((refs[r], f"{type(cause).__name__}: {cause}"))
    if failed:
        raise WeightSyncError([n for n, _ in failed], version, "; ".join(f"{n}: {m}" for n, m in failed))
    if pending:
        # The late loads are left to finish in each engine's order, not ray.cancel'ed: cancelling an actor
        # task still queued on this side leaves a gap in this caller's sequence numbers, and the engine
        # then stalls for Ray's 30 s reorder wait and fails every queued call (seen in CI). An engine that
        # finishes a late load serves and tags its samples with the new version, so nothing is mislabelled.
        budget = timeout_s if budget_s is None else budget_s
        raise WeightSyncError([refs[r] for r in pending], version, f"no answer within the {budget:.3g} s timeout")
    return results


class ObjectStoreWeightSync(WeightSync):
    """CPU path: ``ray.put`` once, every engine loads from the object store into vLLM's in-place reload."""

    def __init__(
        self,
        engines: Sequence[ActorHandle],
        dtype: str = "float32",
        timeout_s: float = 300.0,
        names: Sequence[str] | None = None,
    ) -> None:
        self.engines = list(engines)
        self.names = list(names) if names else _engine_names(self.engines)
        self.dtype = dtype
        self.timeout_s = timeout_s

    def push(self, weights: NamedTensors, version: int) -> SyncReport:
        t0 = time.perf_counter()
        tensors = dict(cast_for_engine(weights, self.dtype, clone=False))
        with warnings.catch_warnings():
            # Ray warns on every zero-copy put; these tensors are detached and contiguous, and engines copy them.
            warnings.filterwarnings("ignore", message="Zero-copy tensor serialization")
            ref = ray.put(tensors)
        # Each engine loads in one call, generation paused around it (a weight update is atomic, weight_gate).
        refs = {e.load_weights.remote(ref, version, self.timeout_s): n
                for e, n in zip(self.engines, self.names, strict=True)}
        details = _wait_all(refs, version, self.timeout_s - (time.perf_counter() - t0), self.timeout_s)
        return SyncReport(
            version=version,
            seconds=time.perf_counter() - t0,
            engines=list(self.names),
            num_tensors=len(tensors),
            num_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
            details=details,
        )


class _EngineClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over ``PolicyEngine`` actors, with a deadline per call.

    ``init_weight_transfer_engine`` gives each engine its own ``rank_offset`` (``ranks.offset(i)``) and a
    bounded rendezvous; vLLM's trainer would send all of them offset 1.
    """

    def __init__(self, engines: Sequence[ActorHandle], names: Sequence[str], timeout_s: float,
                 ranks: NcclRanks | None = None) -> None:
        from dreamgym.placement import NcclRanks

        self.engines, self.names, self.timeout_s = list(engines), list(names), timeout_s
        self.ranks = ranks or NcclRanks(len(self.engines))
        self.version = -1
        self.transaction = ""

    def _all(self, method: str, *args: Any) -> list[Any]:
        refs = {getattr(e, method).remote(*args): n for e, n in zip(self.engines, self.names, strict=True)}
        return _wait_all(refs, self.version, self.timeout_s)

    def init_payloads(self, init_info: dict[str, Any]) -> list[dict[str, Any]]:
        """The worker init info each engine receives: its own rank offset, the whole group's world size."""
        return [{**init_info, "rank_offset": self.ranks.offset(i), "world_size": self.ranks.world_size}
                for i in range(len(self.engines))]

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        # The engines give up a little before this side does, so their own error (naming them) arrives first.
        engine_timeout = max(1.0, self.timeout_s * 0.9)
        refs = {e.init_weight_transfer_engine.remote(p, engine_timeout): n
                for e, n, p in zip(self.engines, self.names, self.init_payloads(init_info), strict=True)}
        _wait_all(refs, self.version, self.timeout_s)

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        # One transaction id per push, carried by every call of it: an engine refuses a chunk or a finish of
        # another transaction, and pauses generation from start to finish (``dreamgym.weight_gate``).
        self.transaction = f"v{self.version}-{uuid.uuid4().hex[:8]}"
        self._all("start_weight_update", self.version, self.transaction, self.timeout_s)

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._all("update_weights", update_info, self.transaction)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        # The engines re-tie the LM head, reset their prefix cache, take the version of this push and resume.
        self._all("finish_weight_update", int(weight_version) if weight_version is not None else self.version,
                  self.transaction)


class _TrainerEngineSync(WeightSync):
    """A sync driven by one of vLLM's trainer-side weight-transfer engines (NCCL, CUDA IPC) through
    ``_EngineClient``; the transfer runs in a helper thread on the learner's CUDA device, bounded by
    ``timeout_s`` so a dead peer cannot hang the learner."""

    names: list[str]
    client: _EngineClient
    timeout_s: float
    dtype: str
    init_info: Any
    _engine: Any = None

    def _trainer_class(self) -> Any:
        raise NotImplementedError

    def _stalled(self, stage: str) -> str:
        """The message of a ``stage`` (``rendezvous`` or ``transfer``) past ``timeout_s``."""
        raise NotImplementedError

    def push(self, weights: NamedTensors, version: int) -> SyncReport:
        import torch

        from dreamgym.dtypes import torch_dtype

        t0 = time.perf_counter()
        target = torch_dtype(self.dtype)
        # Cast on the learner's device (no host round trip); both transfers send contiguous buffers.
        source = _list_source([(n, t.detach().to(target).contiguous()) for n, t in weights])
        self.client.version = version
        # send_weights drives start/update/finish on the engines. The CUDA device is per thread: the worker
        # thread uses the caller's.
        device = torch.cuda.current_device()

        def on_device(fn: Any, *a: Any, **kw: Any) -> Any:
            torch.cuda.set_device(device)
            return fn(*a, **kw)

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync")
        try:
            if self._engine is None:
                self._engine = pool.submit(
                    on_device, self._trainer_class().trainer_init, self.init_info, client=self.client, source=source,
                ).result(timeout=self.timeout_s)
            self._engine.source = source
            pool.submit(on_device, self._engine.send_weights).result(timeout=self.timeout_s)
        except FutureTimeout:
            raise WeightSyncError(self.names, version, self._stalled(
                "rendezvous" if self._engine is None else "transfer")) from None
        except WeightSyncError:
            raise
        except Exception as e:
            raise WeightSyncError(self.names, version, f"{type(e).__name__}: {e}") from e
        finally:
            pool.shutdown(wait=False)
        return SyncReport(
            version=version,
            seconds=time.perf_counter() - t0,
            engines=list(self.names),
            num_tensors=len(source.pairs),
            num_bytes=sum(t.numel() * t.element_size() for _, t in source.pairs),
        )

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


class NcclWeightSync(_TrainerEngineSync):
    """GPU path: NCCL broadcast from the learner (rank 0) into every engine's tensor-parallel workers.

    Build it in the learner's process (which owns a CUDA device) after the engines were created
    with ``weight_transfer_backend="nccl"``. ``master_address``/``master_port`` must be reachable
    from every engine's node (``learner_rendezvous()``). ``tensor_parallel_size``: GPUs per engine.
    """

    def __init__(
        self,
        engines: Sequence[ActorHandle],
        master_address: str,
        master_port: int,
        timeout_s: float = 300.0,
        dtype: str = "bfloat16",
        packed: bool = True,
        tensor_parallel_size: int = 1,
    ) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        from dreamgym.placement import NcclRanks

        self.dtype = dtype
        self.names = _engine_names(engines)
        self.ranks = NcclRanks(len(engines), tensor_parallel_size)
        self.client = _EngineClient(engines, self.names, timeout_s, self.ranks)
        self.timeout_s = timeout_s
        self.init_info = NCCLTrainerInitInfo(
            master_address=master_address,
            master_port=master_port,
            world_size=self.ranks.world_size,
            packed=packed,
            rank=0,
        )
        self._engine = None

    def _trainer_class(self) -> Any:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

        return NCCLTrainerWeightTransferEngine

    def _stalled(self, stage: str) -> str:
        where = f"{self.init_info.master_address}:{self.init_info.master_port}"
        return (f"NCCL weight {stage} (learner at {where}, world size {self.ranks.world_size}) did not finish within "
                f"{self.timeout_s:.3g} s")


class _IpcEngineClient(_EngineClient):
    """``_EngineClient`` for CUDA IPC: no ranks (the engine's init info carries ``packed`` only), and the IPC handles
    travel pickled (``ipc_handles_pickled``, which vLLM's worker decodes with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``,
    set in the engine's environment) so that vLLM's engine-core message path carries them as plain text."""

    def init_payloads(self, init_info: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(init_info) for _ in self.engines]

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        import base64
        import pickle

        def text(info: dict[str, Any]) -> dict[str, Any]:
            handles = info.get("ipc_handles")
            if handles is None:
                return info
            out = {k: v for k, v in info.items() if k != "ipc_handles"}
            out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode()
            return out

        super().update_weights([text(i) for i in update_info] if isinstance(update_info, list) else text(update_info))


class IpcWeightSync(_TrainerEngineSync):
    """One GPU, colocated (GPU path, marked gpu): the learner hands its weights to the policy engine on the same
    device by CUDA IPC handles (vLLM's ``IPCTrainerWeightTransferEngine``), no copy through the host or a network.

    Build it in the learner's process after the engine was created with ``weight_transfer_backend="ipc"`` in
    the learner's bundle (``train.colocate``: one bundle, one GPU, ``dreamgym.placement``). The engine sleeps during
    the learner step and the driver wakes its weights before this push (``train.sleep_engines``).
    """

    def __init__(self, engines: Sequence[ActorHandle], timeout_s: float = 300.0, dtype: str = "bfloat16") -> None:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        self.dtype = dtype
        self.names = _engine_names(engines)
        self.client = _IpcEngineClient(engines, self.names, timeout_s)
        self.timeout_s = timeout_s
        # Unpacked: each tensor is shared as it is (the learner's cast copy), no staging buffer on the GPU.
        self.init_info = IPCTrainerInitInfo(packed=False, rank=0)
        self._engine = None

    def _trainer_class(self) -> Any:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

        return IPCTrainerWeightTransferEngine

    def _stalled(self, stage: str) -> str:
        return (f"CUDA IPC weight {stage} to the colocated engine did not finish within {self.timeout_s:.3g} s (is the "
                "engine on the learner's GPU? train.colocate places both in one bundle)")


class _MetaList(list):  # type: ignore[type-arg]
    """The parameter metadata, readable as an attribute (vLLM 0.33) and callable (vLLM 0.32)."""

    def __call__(self) -> _MetaList:
        return self


def list_source_class(base: type | None = None, param_meta: type | None = None) -> type:
    """A ``WeightSource`` over already materialised ``(name, tensor)`` pairs, for vLLM 0.32 and 0.33.

    vLLM 0.32 (the CPU stack): ``WeightSource.metadata()`` is an abstract *method* and the trainer iterates
    the source (``__iter__``). vLLM 0.33 (the ``gpu`` extra): ``WeightSource.metadata`` is a
    ``functools.cached_property`` (read as ``source.metadata``) and sending iterates ``source.iter_full()``.
    This class serves both: ``metadata`` is a ``cached_property`` whose value is a list that returns itself
    when called, and ``__iter__`` and ``iter_full`` yield the same pairs. ``base`` / ``param_meta`` default to
    the installed vLLM's ``WeightSource`` / ``ParamMeta`` (tests pass stand-ins shaped like either version).
    """
    if base is None or param_meta is None:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        base, param_meta = base or WeightSource, param_meta or ParamMeta
    meta_cls = param_meta

    class ListSource(base):  # type: ignore[valid-type,misc]
        """``WeightSource`` over ``(name, tensor)`` pairs (LoRA merged, cast, on the learner's GPU)."""

        def __init__(self, pairs: list[tuple[str, torch.Tensor]]) -> None:
            self.pairs = pairs

        @functools.cached_property
        def metadata(self) -> _MetaList:
            return _MetaList(meta_cls(n, t.dtype, tuple(t.shape)) for n, t in self.pairs)

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(self.pairs)

        def iter_full(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(self.pairs)

    return ListSource


def _list_source(pairs: list[tuple[str, torch.Tensor]]) -> Any:
    return list_source_class()(pairs)


def learner_rendezvous() -> tuple[str, int]:
    """``(node IP, free port)`` of this process's node: where the learner (rank 0) opens the NCCL rendezvous.

    Called in the learner actor, so the address is the learner's node as the engines' nodes see it (Ray's
    node IP), and the port is free there (bound and released; the rendezvous opens it moments later).
    """
    import socket

    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return ip, port


def make_weight_sync(cfg: DreamGymConfig, engines: Sequence[ActorHandle]) -> WeightSync:
    """The weight sync ``cfg`` asks for: ``learner.weight_sync`` or, for ``auto``, by ``policy.engine.device``.

    Call it in the learner actor: the NCCL path opens its rendezvous on this process's node
    (``learner_rendezvous``; ``DREAMGYM_NCCL_MASTER=host:port`` overrides it) and needs engines created with
    ``weight_transfer_backend="nccl"`` (``sync_backend(cfg)``).
    """
    import os

    kind = sync_backend(cfg)
    e = cfg.policy.engine
    # ``auto`` is the checkpoint's dtype, which the engines read from the folder they serve: ask them.
    dtype = served_dtype(engines, cfg.learner.sync_timeout_s) if e.dtype == "auto" else e.resolved_dtype()
    if kind == "object_store":
        return ObjectStoreWeightSync(engines, dtype=dtype, timeout_s=cfg.learner.sync_timeout_s)
    if kind == "ipc":
        return IpcWeightSync(engines, timeout_s=cfg.learner.sync_timeout_s, dtype=dtype)
    override = os.environ.get("DREAMGYM_NCCL_MASTER")
    if override:
        host, _, port_s = override.rpartition(":")
        port = int(port_s)
    else:
        host, port = learner_rendezvous()
    return NcclWeightSync(engines, host, port, timeout_s=cfg.learner.sync_timeout_s, dtype=dtype,
                          tensor_parallel_size=e.tensor_parallel_size)


def served_dtype(engines: Sequence[ActorHandle], timeout_s: float) -> str:
    """The dtype the engines serve, as each resolved it from its model (``VllmPolicy.dtype``): the one
    resolution of ``policy.engine.dtype`` (``auto`` and ``native`` included) that the sync casts to."""
    infos = _wait_all({e.info.remote(): n for e, n in zip(engines, _engine_names(engines), strict=True)}, -1,
                      timeout_s)
    dtypes = {i["dtype"] for i in infos}
    if len(dtypes) != 1:
        raise WeightSyncError(_engine_names(engines), -1, f"the engines serve different dtypes {sorted(dtypes)}")
    return dtypes.pop()


def sync_backend(cfg: DreamGymConfig) -> str:
    """``object_store``, ``nccl`` or ``ipc``: ``learner.weight_sync`` as ``dreamgym.sync_choice.choose_weight_sync``
    settles it (``auto`` by where the engines and the learner run)."""
    from dreamgym.sync_choice import weight_sync_of

    return weight_sync_of(cfg)


def engine_transfer_backend(cfg: DreamGymConfig) -> str | None:
    """The ``weight_transfer_backend`` policy engines must be built with (``None`` for the object store)."""
    kind = sync_backend(cfg)
    return None if kind == "object_store" else kind
