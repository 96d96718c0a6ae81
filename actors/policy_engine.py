"""``PolicyEngine``: a Ray actor owning one in-process vLLM engine that serves the policy.

It samples actions for agent turns (``act``) or raw prompts (``generate``) and returns, for every
reply, its token ids, their log-probs and the weight version that produced them; it scores fixed
token sequences (``score``); and it receives new weights, either from the Ray object store
(``load_weights``, CPU path) or by NCCL broadcast through vLLM's weight-transfer API
(``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update``, GPU path). The actor is thin: the engine logic is
``dreamgym.vllm_engine.VllmPolicy``.

A weight update is atomic with respect to generation (``dreamgym.weight_gate``: pause, update, resume). The
weight calls run in their own concurrency group (``WEIGHTS_GROUP``, one thread) beside the generation calls
(the default group, one thread): a sync's ``start_weight_update`` .. ``update_weights`` .. ``finish_weight_update``
is one transaction (its id travels with every call), generation in flight finishes before it begins, and
``act``/``generate``/``score`` calls arriving meanwhile wait (bounded) and then run on the new weights. The
object-store ``load_weights`` is the same transaction in one call.

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
from dreamgym.weight_gate import UpdateGate

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle

#: The engine actor's concurrency group of weight calls (one thread, beside the one of generation calls).
WEIGHTS_GROUP = "weights"


class PolicyEngine:
    """The actor class (wrapped with ``ray.remote`` by ``create_policy_engines``)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        engine_index: int = 0,
        model_path: str | None = None,
        weight_transfer_backend: str | None = None,
        sleep_mode: bool = False,
    ) -> None:
        from dreamgym.vllm_engine import VllmPolicy

        self.name = f"policy-engine-{engine_index}"
        self.cfg = PolicyConfig.model_validate(cfg)
        self.policy = VllmPolicy(self.cfg, engine_index, model_path, weight_transfer_backend=weight_transfer_backend,
                                 sleep_mode=sleep_mode)
        self.gate = UpdateGate(self.name)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": os.getpid(),
            "model_path": str(self.policy.model_path),
            "weight_version": self.policy.weight_version,
            "dtype": self.policy.dtype,
            "start_seconds": self.policy.start_seconds,
            "gpu_ids": [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])],
            "gate": self.gate.state(),
        }

    def weight_version(self) -> int:
        """The version the engine serves now (during an update: the one before it)."""
        return self.policy.weight_version

    # -- sampling (through the gate: never on half-loaded weights) ------------------------------------
    def act(self, turns: Sequence[AgentTurn], n: int = 1, wait_s: float | None = None,
            **kw: Any) -> list[list[ActionSample]]:
        """``n`` actions per turn. ``wait_s``: the longest this call waits on a weight update (the caller's
        watchdog bound, less a margin); unbounded by the caller it still ends at the update's own deadline."""
        with self.gate.generating(f"act ({len(turns)} turns)", wait_s):
            return self.policy.act(turns, n=n, **kw)

    def generate(self, prompts: Sequence[Sequence[int]], n: int = 1, wait_s: float | None = None,
                 **kw: Any) -> list[list[ActionSample]]:
        with self.gate.generating(f"generate ({len(prompts)} prompts)", wait_s):
            return self.policy.generate(prompts, n=n, **kw)

    def prompt_ids(self, turn: AgentTurn) -> list[int]:
        return self.policy.turn_prompt_ids(turn)

    def score(self, sequences: Sequence[Sequence[int]], wait_s: float | None = None) -> list[list[float]]:
        with self.gate.generating(f"score ({len(sequences)} sequences)", wait_s):
            return self.policy.score(sequences)

    def param_checksum(self, name: str = "model.embed_tokens.weight") -> float:
        with self.gate.generating("param_checksum"):
            return self.policy.param_checksum(name)

    # -- weights: object store (CPU), one call ---------------------------------------------------------
    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def load_weights(self, weights: dict[str, torch.Tensor] | list[tuple[str, torch.Tensor]], version: int,
                     timeout_s: float | None = None) -> dict:
        """Load weights delivered through the object store (Ray resolves the reference before the call): a whole
        update in one call, generation paused around it. A set that does not fit the served model is refused
        before anything pauses. ``timeout_s``: the update's bound (``learner.sync_timeout_s``)."""
        pairs = self.policy.check_weights(weights)
        with self.gate.update(f"weights v{version}", timeout_s):
            return {"engine": self.name, **self.policy.load_weights(pairs, version)}

    # -- weights in steps: vLLM's weight-transfer protocol (NCCL on GPU; tensor chunks without a backend) ------
    @ray.method(concurrency_group=WEIGHTS_GROUP)
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

        # Generation pauses meanwhile (the engine's worker takes one call at a time); its weights are untouched.
        with self.gate.update("the NCCL rendezvous", timeout_s, touches_weights=False):
            t = threading.Thread(target=join, name=f"{self.name}-nccl-init", daemon=True)
            t.start()
            t.join(timeout_s)
        if t.is_alive() and self.policy.transfer_backend == "ipc":
            raise TimeoutError(f"{self.name}: the CUDA IPC weight-transfer init did not complete in {timeout_s:g} s")
        if t.is_alive():
            raise TimeoutError(
                f"{self.name}: NCCL weight-transfer rendezvous with {init_info.get('master_address')}:"
                f"{init_info.get('master_port')} (rank offset {init_info.get('rank_offset')}, world size "
                f"{init_info.get('world_size')}) did not complete within {timeout_s:g} s; is the learner's "
                "address reachable from this engine's node, and did every engine get its own ranks?"
            )
        if "error" in box:
            raise box["error"]

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def start_weight_update(self, version: int | None = None, transaction: str | None = None,
                            timeout_s: float | None = None) -> str:
        """Open the update transaction: pause generation (the call in flight finishes first), then begin vLLM's
        update (its layers leave for the meta device). Returns the transaction id every later call of this
        update must carry; ``timeout_s`` (``learner.sync_timeout_s``) bounds how long generation waits on it."""
        tx = self.gate.begin(f"weights v{version}" if version is not None else "weights", timeout_s, transaction)
        try:
            self.policy.start_update()
        except BaseException as e:
            self.gate.end(tx, f"start_weight_update: {type(e).__name__}: {e}")
            raise
        return tx

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def update_weights(self, update_info: Any, transaction: str) -> int:
        """One chunk of the open transaction (NCCL: the update info of a broadcast running meanwhile; without a
        transfer backend: ``(HF name, tensor)`` pairs). A chunk of another transaction is refused."""
        self.gate.check(transaction, "update_weights")
        try:
            return self.policy.update_chunk(update_info)
        except BaseException as e:
            self.gate.end(transaction, f"update_weights: {type(e).__name__}: {e}")
            raise

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def finish_weight_update(self, version: int | None = None, transaction: str | None = None) -> dict:
        """Finish vLLM's update, re-tie the head, reset the prefix cache, serve ``version``; resume generation."""
        if transaction is None:
            raise ValueError(f"{self.name}: finish_weight_update needs the transaction id start_weight_update "
                             "returned")
        self.gate.check(transaction, "finish_weight_update")
        try:
            done = self.policy.finish_update(version)
        except BaseException as e:
            self.gate.end(transaction, f"finish_weight_update: {type(e).__name__}: {e}")
            raise
        self.gate.end(transaction)
        return {"engine": self.name, **done}

    # -- sleep during the learner step (train.sleep_engines: one GPU shared with the learner) -------------
    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def sleep(self, level: int = 1, timeout_s: float | None = None) -> dict:
        """Sleep while the learner steps: the generation in flight finishes first, then vLLM's sleep (level 1:
        weights to host memory, KV cache and prefix cache freed; on CPU only the scheduler pauses). Generation is
        refused, naming the sleep, until ``wake_up`` has woken everything."""
        import time

        t0 = time.perf_counter()
        with self.gate.update(f"sleep (level {level})", timeout_s, touches_weights=False):
            self.policy.llm.sleep(level=level)
            self.gate.fall_asleep(f"asleep at level {level} while the learner steps (train.sleep_engines); the "
                                  "driver wakes it after the weight sync")
        return {"engine": self.name, "seconds": time.perf_counter() - t0}

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def wake_up(self, tags: list[str] | None = None) -> dict:
        """Wake what ``tags`` names (``weights`` before a sync writes into them, ``kv_cache`` after; ``None``:
        everything). Generation resumes once nothing sleeps."""
        import time

        t0 = time.perf_counter()
        self.policy.llm.wake_up(tags)
        awake = not self.policy.llm.llm_engine.is_sleeping()
        if awake:
            self.gate.wake()
        return {"engine": self.name, "awake": awake, "seconds": time.perf_counter() - t0}

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def shutdown_weight_transfer_engine(self) -> None:
        with self.gate.update("the NCCL group's shutdown", touches_weights=False):
            self.policy.llm.collective_rpc("shutdown_weight_transfer_engine")


def create_policy_engines(
    cfg: PolicyConfig,
    num_engines: int | None = None,
    model_path: str | Path | None = None,
    weight_transfer_backend: str | None = None,
    name_prefix: str | None = None,
    placements: Sequence[tuple[dict[str, Any], dict[str, str]]] | None = None,
    one_by_one: bool = False,
    sleep_mode: bool = False,
) -> list[ActorHandle]:
    """Start ``num_engines`` (default ``cfg.num_engines``) engine actors; returns once all are ready.

    ``one_by_one``: each engine starts once the one before is up (engines that may share a GPU,
    ``dreamgym.placement.shares_gpus``: vLLM's profiling would charge one engine's memory to the other).

    ``weight_transfer_backend="nccl"`` or ``"ipc"`` for the GPU weight syncs (``actors.weight_sync.NcclWeightSync``,
    ``IpcWeightSync``). ``sleep_mode``: the engines sleep during learner steps (``train.sleep_engines``).
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
    env = engine_env(cfg.engine.device, cfg.engine.omp_threads, cfg.engine.enforce_eager)
    if weight_transfer_backend == "ipc":
        # vLLM's worker unpickles the IPC handles (``ipc_handles_pickled``) only with this set; they come from the
        # learner on the same GPU, in this run.
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
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
        # Generation one call at a time (the default group), weight calls on their own thread (WEIGHTS_GROUP;
        # Ray takes concurrency groups in ``ray.remote`` only, not in ``.options``).
        actor_cls = ray.remote(concurrency_groups={WEIGHTS_GROUP: 1})(PolicyEngine).options(**options)
        handles.append(
            actor_cls.remote(cfg.model_dump(mode="json"), i, str(model_path) if model_path else None,
                             weight_transfer_backend, sleep_mode)
        )
        if one_by_one:
            start_or_kill(handles, {handles[-1].info.remote(): f"policy-engine-{i}"}, cfg.engine.start_timeout_s,
                          "policy.engine.start_timeout_s")
    return start_or_kill(handles, {h.info.remote(): f"policy-engine-{i}" for i, h in enumerate(handles)},
                         cfg.engine.start_timeout_s, "policy.engine.start_timeout_s")
