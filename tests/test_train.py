"""``dreamgym train`` end to end on twx:coin with tiny models: synthetic, s2r and real modes, and resume.

Real components throughout: a real local Ray cluster (the ``ray_cluster`` fixture, or the subprocess's
own), real TextWorldExpress games, a tiny random Llama served by vLLM as the policy and trained by the
GRPO learner, the embedded replay buffer with the MiniLM encoder. The experience model is either a tiny
vLLM replica (which cannot write the reply format: every synthetic step is an invalid transition, counted
and kept out of training) or an OpenAI-compatible HTTP server on loopback that copies the top retrieved
demonstration (the retrieval-only baseline of the experience-model issue), so synthetic steps are valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_openai_server import ScriptedOpenAIServer

from dreamgym.config import deep_merge, validate_config
from dreamgym.data.transitions import TransitionWriter
from dreamgym.experience.prompts import format_reply

VENV_BIN = Path(sys.executable).parent


def tiny_config(out_dir: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A run small enough for a test: 2 tasks x 3 episodes per iteration, 3 held-out tasks, 6-step episodes."""
    base: dict[str, Any] = {
        "run": {"name": "t", "out_dir": str(out_dir)},
        "env": {"name": "twx:coin", "max_steps": 6},
        "collect": {"policy": "mixed", "episodes": 24, "workers": 1},
        "policy": {"model": "tiny", "max_tokens": 8, "worked_example": True, "history_steps": 0,
                   "engine": {"num_cpus": 0.25, "kv_cache_gib": 0.25, "max_model_len": 2048}},
        "experience_model": {"model": "tiny", "max_tokens": 24, "max_attempts": 2, "top_k": 2,
                             "engine": {"num_cpus": 0.25, "kv_cache_gib": 0.25, "max_model_len": 2048,
                                        "dtype": "float32"}},
        "learner": {"group_size": 3, "lr": 1e-3, "device": "cpu", "num_cpus": 0.25, "threads": 1},
        "curriculum": {"seed_tasks": 6, "tasks_per_iteration": 2, "llm_variants": 0, "param_variants": 0},
        "replay": {"num_cpus": 0.1},
        "train": {"iterations": 2, "eval": {"tasks": 3},
                  "rollout": {"envs_per_worker": 6, "synthetic_threads": 6, "num_cpus": 0.1},
                  "report": {"progress": True},
                  "warm_start": {"method": "sft", "steps": 12, "lr": 1e-2, "batch_episodes": 4}},
    }
    return deep_merge(base, sections)


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _check_run_dir(run_dir: Path, iterations: int) -> list[dict[str, Any]]:
    records = _read_metrics(run_dir)
    iters = [r for r in records if r["event"] == "iteration"]
    assert [r["iteration"] for r in iters] == list(range(1, iterations + 1))
    evals = [r for r in records if r["event"] == "eval"]
    assert evals and all(0 <= e["baseline_success_rate"] <= 1 for e in evals)  # always beside the baseline
    assert all(len(e["outcomes"]) == e["episodes"] for e in evals)  # per-episode outcomes: the paired verdict
    assert (run_dir / "config.yaml").is_file() and list((run_dir / "tensorboard").iterdir())
    report = (run_dir / "report.md").read_text()
    assert report.splitlines()[2] == "## Did it learn?"  # the verdict first (dreamgym.verdict)
    assert "random-valid success" in report and (run_dir / "plots" / "eval_success.png").is_file()
    assert any((run_dir / "checkpoints").glob("step-*/driver.json"))
    return records


def _copy_top_demonstration(body: dict[str, Any]) -> str:
    """The experience model as the retrieval-only copy baseline: the outcome of demonstration [1]."""
    user = body["messages"][-1]["content"]
    if "[1] State:" not in user:
        return "no demonstration to copy"
    block = user.split("[1] State:", 1)[1]
    nxt = block.split("Next state:", 1)[1].split("\n")[0].strip()
    r = block.split("Reward:", 1)[1].split("\n")[0].split()
    return format_reply(nxt, float(r[0]), r[2] == "true", r[4] == "true", "copied from the closest real transition")


def test_default_config_fits_this_machine() -> None:
    """`dreamgym train` without a config: twx:coin, SmolLM2 as policy and experience model, on 2 CPUs."""
    from actors.train_setup import requested_resources
    from dreamgym.commands.train import default_train_config
    from dreamgym.config import load_config

    cfg = load_config(default_train_config())
    assert cfg.env.name == "twx:coin" and cfg.policy.model == cfg.experience_model.model == "smollm2-135m"
    assert cfg.train.mode == "s2r" and cfg.replay.backend == "edge" and cfg.ray.address is None
    assert requested_resources(cfg) <= (2.0, 0.0)


def test_train_help_is_light() -> None:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "dreamgym.cli", "train", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--resume" in r.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time")}
    heavy = [m for m in ("torch", "vllm", "ray") if m in imported]
    assert not heavy, heavy


@pytest.mark.slow
@pytest.mark.timeout(1800)  # minutes on a quiet machine; a loaded 2-core box needs the margin
@pytest.mark.engine
def test_s2r_with_a_vllm_experience_replica_and_a_real_budget(ray_cluster, tmp_path: Path) -> None:
    from actors.driver import run_train

    # invalid_episodes drop: an episode an invalid transition ended leaves the batch whole (``truncate``, the
    # default, keeps its valid prefix: tests/test_rollout.py)
    # inadmissible: model: the tiny policy writes no valid action, and settling them (the default) would keep
    # every step from the replica whose invalid replies this test counts
    cfg = validate_config(tiny_config(tmp_path, experience_model={"inadmissible": "model"},
                                      train={"mode": "s2r", "iterations": 3, "synthetic_iterations": 1,
                                             "real_budget": 10, "checkpoint_every": 0, "invalid_episodes": "drop"}))
    s = run_train(cfg)
    records = _check_run_dir(Path(s["run_dir"]), s["iterations"])
    iters = [r for r in records if r["event"] == "iteration"]
    assert iters[0]["phase"] == "synthetic" and all(r["phase"] == "real" for r in iters[1:])
    # the tiny replica rarely writes the reply format: every synthetic episode meets an invalid transition,
    # counted, and kept out of the buffer's demonstrations and out of the learner's groups
    assert s["synthetic_transitions"] > 0 and s["invalid_transitions"] == iters[0]["rollout"]["invalid_transitions"] > 0
    assert iters[0]["groups"]["groups"] == 0 and iters[0]["left_out"] > 0
    # the real phase stops at the first iteration boundary after the budget is spent
    assert s["real_transitions"] >= 10 and s["iterations"] == 2
    warm = [r for r in records if r["event"] == "warm_start"]
    assert len(warm) == 12 and warm[-1]["nll"] < warm[0]["nll"]


def _wait_for(path_glob: tuple[Path, str], proc: subprocess.Popen, timeout: float) -> Path:
    root, pattern = path_glob
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
        if proc.poll() is not None:
            raise AssertionError(f"dreamgym train exited early with {proc.returncode}")
        time.sleep(1)
    raise AssertionError(f"nothing matched {pattern} under {root} within {timeout} s")


def _checkpoint_of_session(root: Path, session: int) -> bool:
    """Whether a run under ``root`` wrote a checkpoint in its ``session``-th session."""
    for f in root.glob("t-train-*/checkpoints/step-*/driver.json"):
        with contextlib.suppress(OSError, ValueError):  # a checkpoint being written
            if json.loads(f.read_text()).get("sessions") == session:
                return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(1800)  # minutes on a quiet machine; a loaded 2-core box needs the margin
@pytest.mark.ray
@pytest.mark.engine
def test_a_killed_driver_resumes_and_sigterm_then_stops_the_run_cleanly(tmp_path: Path) -> None:
    """``kill -9`` of ``dreamgym train`` (the driver and the local Ray it started) after its first checkpoint, then
    ``dreamgym train --resume``: the run continues from its last checkpoint (iterations after it may run twice,
    never skipped). The resumed driver then gets SIGTERM (``kill``, a scheduler, ``ray job stop``): it cleans up like
    Ctrl-C (exit 130) and every process it started (Ray, engines, workers, Java games) is gone. Its output until
    then has no line of Ray's that a user reads as an error."""
    import psutil

    # No offline collection (a real-mode run needs none): the kill and the resume are under test.
    cfg = tiny_config(tmp_path / "runs", ray={"num_cpus": 2}, collect={"episodes": 0},
                      train={"mode": "real", "iterations": 20, "warm_start": {"method": "none"},
                             "eval": {"enabled": False}, "checkpoint_every": 1})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    with (tmp_path / "first.log").open("w") as log:
        proc = subprocess.Popen([str(VENV_BIN / "dreamgym"), "train", str(tmp_path / "cfg.yaml")], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            ckpt = _wait_for((tmp_path / "runs", "t-train-*/checkpoints/step-000001/driver.json"), proc, 600)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started, nothing else
            proc.wait()
    run_dir = ckpt.parents[2]
    done_before = [r["iteration"] for r in _read_metrics(run_dir) if r["event"] == "iteration"]
    assert len(done_before) >= 1

    second = tmp_path / "second.log"
    with second.open("w") as log:
        proc = subprocess.Popen([str(VENV_BIN / "dreamgym"), "train", "--resume", str(run_dir)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.time() + 900
            while not _checkpoint_of_session(tmp_path / "runs", 2):  # the resumed session has made progress
                assert proc.poll() is None and time.time() < deadline, second.read_text()[-3000:]
                time.sleep(1)
            started = psutil.Process(proc.pid).children(recursive=True)
            assert any("ray::" in " ".join(p.cmdline()) for p in started if p.is_running())
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=180) == 130, second.read_text()[-3000:]
            _, alive = psutil.wait_procs(started, timeout=60)
            assert not alive, [(p.pid, p.cmdline()[:3]) for p in alive]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out = second.read_text()
    assert "resuming at iteration" in out, out[-3000:]
    iters = [x["iteration"] for x in _read_metrics(run_dir) if x["event"] == "iteration"]
    # iterations after the checkpoint may be run twice (the killed session's partial work), never skipped
    assert iters[-1] > done_before[0] and set(range(1, iters[-1] + 1)) <= set(iters)
    driver = json.loads(sorted((run_dir / "checkpoints").glob("step-*/driver.json"))[-1].read_text())
    assert driver["sessions"] == 2 and driver["iteration"] >= 2  # a checkpoint of the resumed session
    # A normal run's output is quiet: neither Ray's token notice nor its error line about constructor arguments in
    # the object store (the offline data goes with each rollout call instead).
    assert "Token authentication" not in out and "constructor arguments in the object store" not in out, out


WEBARENA_PAGES = [
    ("RootWebArea 'Shop' link 'Orders' link 'Account' searchbox", "click [Orders]",
     "RootWebArea 'Orders' table 'Order 17 shipped' link 'Back'"),
    ("RootWebArea 'Forum' link 'New post' link 'Inbox' textbox", "click [Inbox]",
     "RootWebArea 'Inbox' list 'Message from admin' link 'Back'"),
]


def _webarena_offline(path: Path) -> Path:
    """Offline WebArena-Lite-style transitions (accessibility-tree states), as a user's collected file would
    hold them; no server exists anywhere in the test."""
    rows = []
    for task, (state, action, nxt) in enumerate(WEBARENA_PAGES):
        for ep in range(3):
            rows.append({"episode_id": f"wa-{task}-{ep}", "step": 0, "task_id": f"remote:webarena/{task}",
                         "env": "remote:webarena", "instruction": f"Open the page of task {task}.",
                         "state": state, "action": action, "next_state": nxt, "reward": float(ep == 0),
                         "done": True, "success": ep == 0, "admissible_actions": None, "source": "real",
                         "policy": "offline"})
    with TransitionWriter(path) as w:
        w.write(rows)
    return path


def _reward_by_action(body: dict[str, Any]) -> str:
    """An experience model that pays some actions and not others (a stable function of the action text), so
    GRPO groups have reward variance; every episode ends after one step."""
    action = body["messages"][-1]["content"].rsplit("Action:", 1)[-1].strip()
    paid = int(hashlib.sha256(action.encode()).hexdigest(), 16) % 2 == 0
    return format_reply("RootWebArea 'Done'", float(paid), True, paid, "the page the action leads to")


def _pays_nothing_on_task_0(body: dict[str, Any]) -> str:
    """Task 0's episodes all earn 0 (a group without reward variance); task 1's are paid by action text."""
    if "Task: Open the page of task 0." in body["messages"][-1]["content"]:
        return format_reply("RootWebArea 'Done'", 0.0, True, False, "nothing happens")
    return _reward_by_action(body)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.engine
def test_synthetic_training_needs_no_real_environment_and_resamples_a_round_without_reward_variance(
        ray_cluster, tmp_path: Path) -> None:
    """DreamGym on an environment that is not RL-ready (WebArena-Lite): with offline data and evaluation off,
    two synthetic iterations train (new weight versions) while the environment's server does not exist: the
    URL points at a closed port, so any reset or step of the real environment would fail the run.

    ``train.resample`` in the same run: iteration 1's first round's only group (task 0, which the experience model
    never pays) has no reward variance, so the curriculum records it and the iteration runs task 1 as well; both
    groups reach one learner step, and the curriculum counts each group once."""
    from actors.driver import run_train

    offline = _webarena_offline(tmp_path / "webarena.parquet")
    with ScriptedOpenAIServer(_pays_nothing_on_task_0) as server:
        cfg = validate_config(tiny_config(
            tmp_path, env={"name": "remote:webarena", "url": "http://127.0.0.1:9", "max_steps": 3},
            experience_model={"backend": "http", "url": server.url, "top_k": 1},
            curriculum={"seed_tasks": 2, "tasks_per_iteration": 1, "generated_fraction": 0.0, "llm_variants": 0,
                        "param_variants": 0},
            learner={"group_size": 6},
            train={"mode": "synthetic", "iterations": 2, "offline_data": str(offline),
                   "resample": {"min_mixed_groups": 1, "synthetic_rounds": 2}, "sleep_engines": True,
                   "warm_start": {"method": "none"}, "eval": {"enabled": False}}))
        s = run_train(cfg)
    assert s["iterations"] == 2 and s["real_transitions"] == 0 and s["eval_transitions"] == 0
    assert s["learner_steps"] == 2, s  # every synthetic iteration moved the weights
    iters = [r for r in _read_metrics(Path(s["run_dir"])) if r["event"] == "iteration"]
    assert [int(it["learner"]["version"]) for it in iters] == [1, 2]
    # train.sleep_engines (as on one GPU shared with the learner): the engine slept through every learner step
    # and was woken (weights, then everything) around every sync; the next iteration sampled from the new version
    phases = [set(it["phase_seconds"]) for it in iters]
    assert all({"sleep", "learner", "wake", "sync"} <= p for p in phases), phases
    assert all(it["rollout"]["real_resets"] == 0 and it["groups"]["mixed_groups"] >= 1 for it in iters)
    assert {t.split("#")[0] for it in iters for t in it["tasks"]} <= {"remote:webarena/0", "remote:webarena/1"}
    report = (Path(s["run_dir"]) / "report.md").read_text()
    assert "synthetic episodes whose reward agrees with their success: 100%" in report
    # the resampled round of iteration 1
    it = iters[0]
    assert it["rounds"] == 2 and it["tasks"] == ["remote:webarena/0", "remote:webarena/1"], it
    assert it["groups"]["groups"] == 2 and it["groups"]["mixed_groups"] == 1
    assert it["rollout"]["episodes"] == 12 and it["curriculum"]["groups"] == 2


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.engine
def test_ppo_trains_in_both_phases_colocated(ray_cluster, tmp_path: Path) -> None:
    """``--learner.algorithm ppo`` through the whole loop, in a synthetic and then a real iteration (``s2r``: the
    phases the ``synthetic`` and ``real`` modes consist of): groups of one episode per task reach the learner,
    the critic trains in each phase, and the report shows its value loss and explained variance. The run is
    ``train.colocate`` on CPU: the learner and the engine start in the plan's one group (no second reservation),
    the weight syncs run between them, and the group is removed at the end.

    The same run shows the synthetic phase on an HTTP experience model (the copy baseline: every reply valid)
    writing its experience to the replay buffer, ``train.max_staleness 1`` (the real iteration's rollouts overlap
    the synthetic iteration's learner step and no group is dropped), no evaluation before training
    (``eval.at_start false``: no start figure rather than the final one twice), and everything a run directory
    holds. (GRPO in ``synthetic`` mode: ``test_synthetic_training_needs_no_real_environment_...`` and the tiny
    study's DreamGym arm, tests/test_study.py.)"""
    from ray.util import placement_group_table

    from actors.driver import run_train
    from dreamgym.placement import plan_placement

    with ScriptedOpenAIServer(_copy_top_demonstration) as server:
        cfg = validate_config(tiny_config(
            tmp_path, experience_model={"backend": "http", "url": server.url},
            learner={"algorithm": "ppo", "group_size": 1},
            curriculum={"tasks_per_iteration": 4},
            train={"mode": "s2r", "iterations": 2, "synthetic_iterations": 1, "colocate": True, "max_staleness": 1,
                   "warm_start": {"method": "none"}, "eval": {"at_start": False, "tasks": 2}}))
        assert [g.name for g in plan_placement(cfg).groups] == ["colocated"]
        s = run_train(cfg)
    assert all(g["state"] == "REMOVED" for g in placement_group_table().values())
    assert s["iterations"] == 2 and s["learner_steps"] == 2, s
    assert s["synthetic_transitions"] > 0 and s["invalid_transitions"] == 0 and s["real_transitions"] > 0
    assert s["success_start"] is None and s["success_final"] is not None
    records = _check_run_dir(Path(s["run_dir"]), 2)
    iters = [r for r in records if r["event"] == "iteration"]
    assert [it["phase"] for it in iters] == ["synthetic", "real"]
    assert all("value_loss" in it["learner"] and "explained_variance" in it["learner"] for it in iters)
    assert "## Critic (PPO)" in (Path(s["run_dir"]) / "report.md").read_text()
    synthetic = iters[0]
    assert synthetic["rollout"]["em_model_calls"] + synthetic["rollout"]["em_settled"] > 0
    assert synthetic["replay"]["stored"] + synthetic["replay"]["duplicates"] > 0  # synthetic experience was kept
    assert all(it["stale_groups"] == 0 for it in iters)
