"""``dreamgym.weight_gate`` with real threads (no engine): an update waits for the generation in flight, calls
arriving meanwhile wait and run after it, every wait is bounded and named, and a transaction cannot be
interleaved. The engine-level proof with a real vLLM engine is in tests/test_policy_engine.py."""

from __future__ import annotations

import threading
import time

import pytest

from dreamgym.errors import ActorHungError, WeightUpdateStalledError
from dreamgym.weight_gate import UpdateGate


def _generate(gate: UpdateGate, log: list[str], name: str, hold_s: float = 0.0, wait_s: float | None = None) -> None:
    with gate.generating(name, wait_s):
        log.append(f"{name} start")
        time.sleep(hold_s)
        log.append(f"{name} end")


def test_pause_update_resume_orders_generation_around_the_update() -> None:
    gate, log = UpdateGate("policy-engine-0"), []
    inflight = threading.Thread(target=_generate, args=(gate, log, "old", 0.3))
    inflight.start()
    time.sleep(0.05)
    tx = gate.begin("weights v1", timeout_s=5)  # pauses: returns once the generation in flight has ended
    log.append("update")
    late = threading.Thread(target=_generate, args=(gate, log, "new"))
    late.start()
    time.sleep(0.2)
    assert "new start" not in log  # it waits while the update is open
    with pytest.raises(RuntimeError, match="one update at a time"):
        gate.begin("weights v2", timeout_s=5)
    with pytest.raises(RuntimeError, match="update_weights of transaction other refused"):
        gate.check("other", "update_weights")
    gate.check(tx, "update_weights")
    gate.end(tx)
    for t in (inflight, late):
        t.join(5)
    assert log == ["old start", "old end", "update", "new start", "new end"]


def test_waits_are_bounded_and_a_failed_update_refuses_generation_until_the_next() -> None:
    gate = UpdateGate("policy-engine-0")
    tx = gate.begin("weights v1", timeout_s=0.3)
    with pytest.raises(WeightUpdateStalledError, match=r"train\.watchdog\.engine_s") as caller_bound:
        _generate(gate, [], "act (1 turns)", wait_s=0.1)
    assert isinstance(caller_bound.value, ActorHungError)  # the driver treats it as a fault
    with pytest.raises(WeightUpdateStalledError, match=r"past its 0\.3 s bound \(learner\.sync_timeout_s\)"):
        _generate(gate, [], "act (1 turns)")
    gate.end(tx, "update_weights: RuntimeError: NCCL error")
    with pytest.raises(WeightUpdateStalledError, match=r"weights v1 failed .*NCCL error"):
        _generate(gate, [], "act (1 turns)")
    gate.end(gate.begin("weights v2", timeout_s=5))  # a finished update makes the weights whole again
    _generate(gate, log := [], "act")
    assert log == ["act start", "act end"]
    # A pause that does not touch the weights (the NCCL rendezvous) leaves them whole whatever happens.
    with pytest.raises(TimeoutError), gate.update("the NCCL rendezvous", 5, touches_weights=False):
        raise TimeoutError("rendezvous")
    _generate(gate, [], "act")
