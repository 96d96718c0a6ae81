"""Faults inside ``dreamgym train``: every actor kind killed mid-run, a frozen engine, a simulator that goes bad.

Real components: a real local Ray cluster, real TextWorldExpress data, the tiny vLLM policy, the GRPO learner,
two replay shards with the MiniLM encoder. Actors are killed with SIGKILL (or stopped with SIGSTOP) from outside,
as ``kill -9`` would, while they are in use; the bad simulator is an OpenAI-compatible experience-model server
that starts returning empty replies after the third iteration.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from replay_fixtures import twx_parquet  # noqa: F401 - a fixture
from scripted_openai_server import ScriptedOpenAIServer
from test_train import _copy_top_demonstration, _read_metrics, tiny_config

from dreamgym.config import GuardConfig, validate_config
from dreamgym.guard import SimulatorCollapsedError, SimulatorGuard
from dreamgym.runs import MetricsLog


def _stats(steps: int, invalid: int, episodes: int, invalid_eps: int, paid: int, agree: int) -> dict[str, Any]:
    return {"steps": steps, "invalid_transitions": invalid, "episodes": episodes, "invalid_episodes": invalid_eps,
            "paid_episodes": paid, "outcome_agreements": agree}


def test_the_guard_trips_on_the_window_not_on_one_noisy_iteration() -> None:
    g = SimulatorGuard(GuardConfig(window=2, min_steps=10, max_invalid_rate=0.5))
    assert not g.observe(_stats(4, 4, 2, 2, 0, 0)).tripped  # 4 steps: below min_steps, not judged
    v = g.observe(_stats(12, 2, 6, 1, 3, 5))  # window: 16 steps, 6 invalid (37.5%)
    assert not v.tripped and v.window.steps == 16 and abs(v.window.invalid_rate - 6 / 16) < 1e-9
    v = g.observe(_stats(12, 10, 6, 5, 0, 1))  # the first iteration left the window: 24 steps, 12 invalid
    assert not v.tripped and v.iterations == 2
    v = g.observe(_stats(12, 11, 6, 6, 0, 0))  # 24 steps, 21 invalid
    assert v.tripped and "invalid transitions 88% > train.guard.max_invalid_rate 50%" in v.reasons[0]
    assert "resume" in v.message() and "train.guard" in v.message()


def test_the_guard_watches_the_reward_rate_and_agreement_when_asked() -> None:
    paid_always = _stats(20, 0, 10, 0, 10, 2)
    assert not SimulatorGuard(GuardConfig()).observe(paid_always).tripped  # defaults: only the invalid rate
    v = SimulatorGuard(GuardConfig(max_reward_rate=0.9, min_outcome_agreement=0.5)).observe(paid_always)
    assert v.tripped and len(v.reasons) == 2 and "reward rate 100%" in v.reasons[0]
    v = SimulatorGuard(GuardConfig(min_reward_rate=0.1)).observe(_stats(20, 0, 10, 0, 0, 10))
    assert v.tripped and "reward rate 0% < train.guard.min_reward_rate 10%" in v.reasons[0]
    assert not SimulatorGuard(GuardConfig(enabled=False, min_reward_rate=0.1)).observe(
        _stats(20, 0, 10, 0, 0, 10)).tripped


def _worker(tmp_path: Path) -> Any:
    """Rollout worker 0 of the run under ``tmp_path`` (named ``rollout-<run>-<driver pid>-<i>``)."""
    import ray

    run = next(tmp_path.glob("t-train-*"))
    return ray.get_actor(f"rollout-{run.name}-{os.getpid()}-0")


def _running_episodes(tmp_path: Path, not_pid: int | None = None) -> dict[str, Any] | None:
    """Worker 0's progress while it runs training episodes and has taken a step (in a process other than
    ``not_pid``: a worker Ray restarted), else None."""
    import ray

    p = ray.get(_worker(tmp_path).progress.remote(), timeout=10)
    return p if p["running"] and p["phase"] == "synthetic" and p["steps"] >= 1 and p["pid"] != not_pid else None


def _own_process(name: str, count: int = 1) -> Any:
    """The ``ray::<name>`` process of this test's own Ray (another run on the machine has its own); with
    ``count`` of them alive, the oldest."""
    import psutil

    found = [p for p in psutil.Process().children(recursive=True) if f"ray::{name}" in " ".join(p.cmdline())]
    assert len(found) == count, [p.cmdline()[:2] for p in found]
    return min(found, key=lambda p: p.pid)


def _alive_actor(class_name: str) -> dict[str, Any]:
    """The one live actor of ``class_name`` in this test's Ray, from Ray's own actor table (pid included)."""
    from ray._private import state

    alive = [a for a in state.actors(actor_state_name="ALIVE").values() if a["ActorClassName"] == class_name]
    assert len(alive) == 1, [(a["ActorClassName"], a["Pid"]) for a in alive]
    return alive[0]


def _in_turn(steps: list[tuple[str, Any, Any]], timeout: float = 900.0) -> threading.Thread:
    """Run each ``(name, condition, action)`` once its ``condition()`` returns something true (polled), one after
    the other, in a thread: ``action(found)`` gets what the condition returned. ``thread.done`` lists the steps
    taken; ``thread.error`` keeps the last error of a condition that raced the run (a restarting actor)."""

    def loop() -> None:
        deadline = time.time() + timeout
        for name, condition, action in steps:
            while time.time() < deadline:
                try:
                    found = condition()
                    if found:
                        action(found)
                        thread.done.append(name)  # type: ignore[attr-defined]
                        break
                except Exception as e:
                    thread.error = e  # type: ignore[attr-defined]
                time.sleep(0.2)
            else:
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.done = []  # type: ignore[attr-defined]
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.engine
def test_a_run_outlives_every_actor_killed_and_a_frozen_engine_then_the_guard_stops_a_bad_simulator(
        ray_cluster, tmp_path: Path, twx_parquet: Path, capfd: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One synthetic run on ``twx:coin`` (the experience model an OpenAI-compatible server that copies the top
    retrieved demonstration, retrieval from two replay shards on every step; 2 rollout workers,
    ``train.rollout.retries 1``, a checkpoint per iteration, ``train.auto_resume 4``) and eight faults in turn,
    each from outside as ``kill`` would send it, then a simulator that goes bad. One run pays the start-up once
    (engine, learner, shards, curriculum); the driver handles a dead actor the same way in every phase.

    1. ``kill -9`` of rollout worker 0 while it runs episodes of iteration 1: Ray restarts it and its share of the
       iteration runs again, so every GRPO group is whole.
    2. ``kill -9`` of a replay shard after checkpoint 1: its retrievals and writes wait for Ray's restart and go on.
    3. ``kill -9`` of worker 0 in iteration 2, then of its rerun: with its one retry spent its share is dropped
       with every other episode of its tasks (it held episodes of both: tasks are dealt round-robin); the run goes
       on and the restarted worker serves the next iteration.
    4. ``kill -9`` of the curriculum actor after checkpoint 2: its next call fails, the run stops with a ``fault``
       naming it and resumes itself from the checkpoint (which holds the curriculum's state).
    5. ``kill -9`` of the policy engine while a worker samples from it: a restarted engine alone would serve other
       weights than the learner's, so the run stops naming the part that died, then resumes itself with every
       actor new.
    6. ``kill -STOP`` of the policy engine (alive, never answering): within ``train.watchdog.engine_s`` the worker's
       wait ends naming the engine and the bound, the status line meanwhile says what is waited for, and the run
       stops with a fault and resumes itself with a new engine.
    7. ``kill -9`` of the learner while the workers run iteration 3: its step fails, the run resumes itself from
       checkpoint 2.
    8. Once iteration 3 is recorded the experience model returns empty replies: iteration 4's transitions are
       invalid, the guard stops the run before the learner sees them, the message says why, and the last
       checkpoint is the last good iteration.

    No traceback reaches the output, and afterwards the buffer holds every acknowledged transition: the offline
    ones by id, and as many in all as the run's writes stored."""
    import actors.driver as driver
    from actors.replay import ShardedReplayBuffer
    from dreamgym.data.transitions import iter_transitions
    from dreamgym.replay.records import point_id

    monkeypatch.setattr(driver, "STATUS_INTERVAL_S", 2.0)  # the status line is under test, not its cadence
    bound = 12.0
    killed: dict[str, int] = {}
    frozen: list[tuple[int, float]] = []

    def records() -> list[dict[str, Any]]:
        return [r for run in tmp_path.glob("t-train-*") for r in MetricsLog(run).read()]

    def count(event: str) -> int:
        return sum(r["event"] == event for r in records())

    def checkpoint(step: int) -> Any:
        return lambda: list(tmp_path.glob(f"t-train-*/checkpoints/step-{step:06d}/driver.json"))

    def kill_worker(name: str) -> Any:
        def go(progress: dict[str, Any]) -> None:
            killed[name] = progress["pid"]
            os.kill(progress["pid"], signal.SIGKILL)
        return go

    def kill_actor(class_name: str) -> Any:
        def go(_: Any) -> None:
            pid = _alive_actor(class_name)["Pid"]
            killed[class_name] = pid
            os.kill(pid, signal.SIGKILL)
        return go

    def kill_shard(_: Any) -> None:
        p = _own_process("ReplayShard", 2)
        killed["ReplayShard"] = p.pid
        p.kill()

    def freeze(_: Any) -> None:
        pid = _alive_actor("PolicyEngine")["Pid"]
        os.kill(pid, signal.SIGSTOP)
        frozen.append((pid, time.time()))

    def in_session(resumes: int) -> Any:
        return lambda: count("auto_resume") == resumes and _running_episodes(tmp_path)

    broken = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        # Checked on each request, not polled from a thread: with ``max_staleness 0`` iteration 4 launches only
        # after iteration 3's record is written, so every reply of iteration 4 is empty (a poller could be late).
        if not broken.is_set() and any(r["event"] == "iteration" and r["iteration"] == 3 for r in records()):
            broken.set()
        return "" if broken.is_set() else _copy_top_demonstration(body)

    steps = [
        ("worker, iteration 1", lambda: _running_episodes(tmp_path), kill_worker("worker, iteration 1")),
        ("shard", checkpoint(1), kill_shard),
        ("worker, iteration 2", lambda: count("iteration") == 1 and _running_episodes(tmp_path),
         kill_worker("worker, iteration 2")),
        ("its rerun", lambda: _running_episodes(tmp_path, not_pid=killed["worker, iteration 2"]),
         kill_worker("its rerun")),
        ("curriculum", checkpoint(2), kill_actor("CurriculumActor")),
        ("engine", in_session(1), kill_actor("PolicyEngine")),
        ("frozen engine", in_session(2), freeze),
        ("learner", in_session(3), kill_actor("LearnerActor")),
    ]
    with ScriptedOpenAIServer(reply) as server:
        # inadmissible: model: the tiny policy writes no admissible action, and settling them (the default) would
        # answer every step without the experience model, whose empty replies the guard must see
        cfg = validate_config(tiny_config(
            tmp_path, experience_model={"backend": "http", "url": server.url, "top_k": 1, "inadmissible": "model"},
            replay={"shards": 2, "num_cpus": 0},
            train={"mode": "synthetic", "iterations": 4, "offline_data": str(twx_parquet),
                   "warm_start": {"method": "none"}, "eval": {"enabled": False}, "checkpoint_every": 1,
                   "auto_resume": 4, "max_staleness": 0, "watchdog": {"engine_s": bound},
                   "guard": {"window": 1, "min_steps": 4},
                   "rollout": {"workers": 2, "retries": 1, "envs_per_worker": 3, "num_cpus": 0.1}}))
        watcher = _in_turn(steps)
        try:
            with pytest.raises(SimulatorCollapsedError,
                               match=r"invalid transitions 100% > train\.guard\.max_invalid_rate"):
                driver.run_train(cfg)
        finally:
            for pid, _ in frozen:  # the run's shutdown kills it; never leave a stopped process behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
    taken = watcher.done  # type: ignore[attr-defined]
    assert taken == [name for name, _, _ in steps], (taken, getattr(watcher, "error", None))
    run_dir = next(tmp_path.glob("t-train-*"))
    recs = _read_metrics(run_dir)
    assert [r["iteration"] for r in recs if r["event"] == "iteration"] == [1, 2, 3]
    iters = {r["iteration"]: r for r in recs if r["event"] == "iteration"}

    # 1 and 3: a rerun keeps every group whole; a spent retry drops the worker's share and its tasks' episodes
    lost = [r for r in recs if r["event"] == "rollout_worker_lost"]
    assert [(r["iteration"], r["worker"], r["rerun"]) for r in lost] == [(0, 0, True), (1, 0, True), (1, 0, False)]
    assert iters[1]["rollout"]["episodes"] == 6 and iters[1]["rollout"]["lost_tasks"] == 0
    assert iters[1]["groups"]["groups"] == 2 and iters[1]["groups"]["min_group_size"] == 3  # whole groups
    assert iters[2]["rollout"]["lost_tasks"] == 2 and iters[2]["groups"]["groups"] == 0
    assert iters[3]["rollout"]["episodes"] == 6 and iters[3]["rollout"]["lost_tasks"] == 0

    # 4 to 7: each a fault naming what failed, each followed by an automatic resume
    fault = [r["what"] for r in recs if r["event"] == "fault"]
    assert len(fault) == 4, fault
    assert "the curriculum actor died" in fault[0], fault
    assert "lost an actor it was calling" in fault[1], fault
    assert "policy-engine-0 act" in fault[2] and f"within {bound:.0f} s (train.watchdog.engine_s)" in fault[2], fault
    assert "the learner actor died" in fault[3], fault
    # The act call that hung began at most one call before the freeze: the bound is honoured within a few s.
    hung = [r for r in recs if r["event"] == "fault"][2]
    assert bound - 5 <= hung["time"] - frozen[0][1] <= bound + 20
    resumed = [r for r in recs if r["event"] == "auto_resume"]
    assert len(resumed) == 4 and all("dreamgym train --resume" in r["after"] for r in resumed)
    err = capfd.readouterr().err
    assert "waits on policy-engine-0 act" in err and "Traceback" not in err

    # 8: nothing learned from iteration 4, and the run resumes from the last good iteration
    guard = [r for r in recs if r["event"] == "guard"]
    assert len(guard) == 1 and guard[0]["tripped"] and guard[0]["invalid_rate"] == 1.0
    last = json.loads(sorted((run_dir / "checkpoints").glob("step-*/driver.json"))[-1].read_text())
    assert last["iteration"] == 3

    # 2: the buffer holds every acknowledged transition, each once, whatever was retried
    seeded = next(r for r in recs if r["event"] == "replay_seed")["stored"]
    written = {r["iteration"]: r["replay"]["stored"] for r in recs if r["event"] == "iteration"}
    assert sum(written.values()) > 0
    buf = ShardedReplayBuffer.create(cfg.replay.model_copy(update={"path": run_dir / "replay"}))
    try:
        stored = {point_id(t) for t in buf.iter_transitions()}
        assert len(buf) == len(stored)
    finally:
        buf.close()
    assert {point_id(t) for t in iter_transitions(twx_parquet)} <= stored
    # Iteration 3 ran in four sessions; a rerun's writes are duplicates or new transitions, never fewer: at least
    # what the recorded iterations acknowledged.
    assert len(stored) >= seeded + sum(written.values())


# A frozen experience-model replica (restarted, its requests answered): tests/test_experience_engine.py::
# test_replicas_serve_synthetic_episodes_and_route_around_a_dead_replica.


@pytest.mark.timeout(600)
def test_a_stalled_experience_model_fine_tune_is_stopped_within_its_bound(
        ray_cluster, tmp_path: Path, twx_parquet: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The experience-model fine-tune inside ``dreamgym train`` runs in Ray actors (one per learner rank) watched
    through its progress file: when the file does not grow for ``experience_model.train.stall_timeout_s`` the ranks
    are killed and the run stops with one line naming the bound. Here the bound (1 s) is shorter than the start
    (annotating, loading the model), which the watchdog cannot tell from a hung rank."""
    import actors.train_setup as setup
    from dreamgym.errors import TrainingFaultError

    monkeypatch.setattr(setup, "STATUS_INTERVAL_S", 0.2)  # look often: the bound is under test, not the cadence
    cfg = validate_config(tiny_config(tmp_path, experience_model={"train": {"base": "tiny", "max_steps": 50,
                                                                            "stall_timeout_s": 1.0}}))
    lines: list[str] = []
    t0 = time.monotonic()
    bound = r"made no progress for 1 s \(experience_model\.train\.stall_timeout_s"
    with pytest.raises(TrainingFaultError, match=bound):
        setup.experience_sft(cfg, twx_parquet, tmp_path, lines.append)
    assert time.monotonic() - t0 < 60
    assert lines and "annotating and loading the base model" in lines[0]
    assert not (tmp_path / "experience_model" / "dreamgym_sft.json").exists()


# SIGTERM of the driver (exit 130, no process left behind, quiet output):
# tests/test_train.py::test_a_killed_driver_resumes_and_sigterm_then_stops_the_run_cleanly.


def test_an_actor_killed_while_starting_is_a_fault_and_a_refusal_is_not(ray_cluster) -> None:
    """Found by the freeze soak (docs/reliability.md): a replica killed while an automatic resume started the
    actors ended the run with a RuntimeError traceback. A start call whose actor died is a training fault
    (``train.auto_resume`` starts the session again); a start the actor refused (its config) stays an error."""
    import ray

    from actors.placement import wait_started
    from dreamgym.errors import ActorDiedStartingError, TrainingFaultError

    @ray.remote(num_cpus=0)
    class Starting:
        def start(self, refuse: bool) -> str:
            if refuse:
                raise ValueError("max_model_len 4096 is longer than the model's context")
            time.sleep(60)
            return "up"

    slow = Starting.remote()
    ref = slow.start.remote(False)
    time.sleep(2)  # the start call is running
    ray.kill(slow)
    with pytest.raises(ActorDiedStartingError, match="experience-replica-0") as died:
        wait_started({ref: "experience-replica-0"}, 60, "experience_model.engine.start_timeout_s")
    assert isinstance(died.value, TrainingFaultError)

    refusing = Starting.remote()
    with pytest.raises(RuntimeError, match="max_model_len 4096") as refused:
        wait_started({refusing.start.remote(True): "policy-engine-0"}, 60, "policy.engine.start_timeout_s")
    assert not isinstance(refused.value, TrainingFaultError)
    ray.kill(refusing)
