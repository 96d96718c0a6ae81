"""The NCCL weight sync's setup on CPU (no GPU, no Ray cluster): the rendezvous is the learner's node address
and a free port, and an engine whose rendezvous never completes gives up within its bound, naming itself,
instead of blocking its actor (one call at a time) and every rollout behind it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

import actors.weight_sync as ws
from dreamgym.config import load_config
from dreamgym.weight_gate import UpdateGate


def _gpu_cfg(tp: int = 1):
    return load_config(overrides={
        "policy": {"num_engines": 2, "engine": {"device": "cuda", "tensor_parallel_size": tp}},
        "learner": {"device": "cuda", "num_gpus": 1, "weight_sync": "nccl", "sync_timeout_s": 42}})


def test_rendezvous_is_the_learners_node_and_a_free_port(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, engines: Any, host: str, port: int, **kw: Any) -> None:
            seen.update(engines=engines, host=host, port=port, **kw)

    monkeypatch.delenv("DREAMGYM_NCCL_MASTER", raising=False)
    monkeypatch.setattr(ws, "NcclWeightSync", Recorder)
    ws.make_weight_sync(_gpu_cfg(tp=2), ["e0", "e1"])
    assert seen["host"] == ray.util.get_node_ip_address() and seen["port"] != 29555
    with socket.socket() as s:  # the port is free on this node
        s.bind(("", seen["port"]))
    assert seen["tensor_parallel_size"] == 2 and seen["timeout_s"] == 42
    monkeypatch.setenv("DREAMGYM_NCCL_MASTER", "10.1.2.3:31000")
    ws.make_weight_sync(_gpu_cfg(), ["e0", "e1"])
    assert (seen["host"], seen["port"]) == ("10.1.2.3", 31000)


def test_engine_rendezvous_is_bounded_and_names_the_engine() -> None:
    from actors.policy_engine import PolicyEngine

    release = threading.Event()

    class StuckLLM:
        def collective_rpc(self, method: str, kwargs: Any = None) -> list[Any]:
            release.wait(30)  # a learner that never arrives
            return [None]

    class Policy:
        llm = StuckLLM()
        transfer_backend = "nccl"

    engine = PolicyEngine.__new__(PolicyEngine)
    engine.name, engine.policy, engine.gate = "policy-engine-1", Policy(), UpdateGate("policy-engine-1")
    info = {"master_address": "10.0.0.5", "master_port": 40000, "rank_offset": 3, "world_size": 5}
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"policy-engine-1: NCCL weight-transfer rendezvous with 10\.0\.0\.5:40000 "
                                           r"\(rank offset 3, world size 5\) did not complete within 0\.5 s"):
        engine.init_weight_transfer_engine(info, timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    release.set()

    class FailingLLM:
        def collective_rpc(self, method: str, kwargs: Any = None) -> list[Any]:
            raise RuntimeError("Weight transfer not configured")

    Policy.llm = FailingLLM()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="Weight transfer not configured"):
        engine.init_weight_transfer_engine(info, timeout_s=5)
