"""``dreamgym train`` on a 2-node Ray cluster started on this machine, with nothing read from a driver-local path.

Node 1 is the head of the session's Ray cluster (the ``ray_cluster`` fixture of ``tests/conftest.py``, 2 CPUs):
it hosts the driver's side, the learner, the policy engine, the replay shards and the curriculum. Node 2, started
here and joined to it, has no CPUs for Ray (``--num-cpus 0``) and a custom resource ``worker_node``: only the actors
that ask for it land there, the rollout workers (``train.rollout.resources``) and the experience-model replica
(``experience_model.engine.resources``), both with ``num_cpus: 0``.

Both nodes share this machine's filesystem, so "nothing reads a driver-local path" is made true by hiding it:
node 2 runs in its own mount namespace (``unshare --mount``, root only) where ``run.out_dir`` is an empty
read-only tmpfs. Any actor of node 2 that opened a file of the run directory (the offline data, a checkpoint)
or wrote one would fail the run. The offline data reaches the workers through the object store
(``actors.files``); the run-directory check (``check_shared_run_dir``) is shown refusing a run whose replay shards
could land on node 2.

Node 2 runs in the foreground (``ray start --block``) in its own process group; the test stops exactly that (no
machine-wide ``ray stop``), with its own temp dir and free ports beside any other Ray on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dreamgym.config import deep_merge

VENV_BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.slow, pytest.mark.ray, pytest.mark.engine,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="hiding the run directory from node 2 needs root and unshare (a mount namespace)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ports() -> list[str]:
    # Every agent port explicit and free: the defaults are shared by every Ray node on this machine.
    return [f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
            f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}"]


#: Run in a helper process (the test process keeps no Ray connection): wait for both nodes, then show what
#: node 2 sees of the run directory.
_PROBE = """
import json, os, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.time() + 180
while time.time() < deadline and sum(n["Alive"] for n in ray.nodes()) < 2:
    time.sleep(1)
nodes = [n for n in ray.nodes() if n["Alive"]]
worker = [n["NodeID"] for n in nodes if "worker_node" in n["Resources"]]
head = [n["NodeID"] for n in nodes if "worker_node" not in n["Resources"]]

@ray.remote(num_cpus=0, resources={"worker_node": 1})
def look(path):
    try:
        os.listdir(path)
        listed = sorted(os.listdir(path))
    except OSError as e:
        listed = repr(e)
    try:
        open(os.path.join(path, "probe"), "w").close()
        wrote = True
    except OSError:
        wrote = False
    return {"node": ray.get_runtime_context().get_node_id(), "listed": listed, "wrote": wrote}

print(json.dumps({"worker": worker, "head": head, "seen": ray.get(look.remote(sys.argv[2]), timeout=120)}))
"""


def _start_node(command: Callable[[int], list[str]], log: Path, env: dict[str, str],
                procs: list[subprocess.Popen], attempts: int = 3) -> None:
    """Start one node (``command(attempt)``: fresh ports and temp dir each time) and wait until it is up.

    Ray gives a node's raylet a fixed 30 s to register; on a machine busy with other work its agents can take
    longer, and ``ray start`` gives up: then the node is started again.
    """
    for attempt in range(attempts):
        out = log.with_name(f"{log.name}-{attempt}.log")
        with out.open("w") as f:
            proc = subprocess.Popen(command(attempt), stdout=f, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                    start_new_session=True)
        procs.append(proc)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if "Ray runtime started" in out.read_text():
                return
            time.sleep(1)
        _stop(proc)
    pytest.fail(f"ray start did not start a node in {attempts} attempts: {out.read_text()[-3000:]}")


def _stop(*procs: subprocess.Popen, grace_s: float = 2.0) -> None:
    """Stop nodes started here: each its own process group only (``ray start --block`` ends what it started).
    All are asked at once and share one grace period: a graceful stop takes ~17 s a node (a grace of 10 s always
    ended in the kill), and every process of these groups is ours, so what is left after ``grace_s`` is killed."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.fixture(scope="module")
def two_nodes(ray_cluster: Any) -> Iterator[dict[str, Any]]:
    # Short paths: Ray's socket paths under the temp dir must stay under 108 characters.
    base = Path(tempfile.mkdtemp(prefix="dg2n-", dir="/tmp"))
    runs = base / "runs"
    runs.mkdir()
    (runs / "driver-only").write_text("on the driver's node only")
    # The session's head: a second head of our own cost ~20 s to start and stop. Its token authentication (on by
    # default in Ray 2.60, RAY_AUTH_MODE set in this process by ray.init, the token in ~/.ray/auth_token) reaches
    # node 2 and the drivers through this environment.
    gcs = ray_cluster.get_runtime_context().gcs_address
    ip = gcs.rsplit(":", 1)[0]
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "HF_HUB_OFFLINE": "1",
           # A machine busy with other work starts a node's agents slowly: wait for them (and the GCS) longer.
           "RAY_agent_register_timeout_ms": "300000", "RAY_raylet_start_wait_time_s": "120",
           "RAY_NUM_REDIS_GET_RETRIES": "120"}
    env.pop("RAY_ADDRESS", None)
    ray_bin = str(VENV_BIN / "ray")
    procs: list[subprocess.Popen] = []

    def node2(attempt: int) -> list[str]:
        # In its own mount namespace, where run.out_dir is an empty read-only tmpfs.
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"', str(runs),
                ray_bin, "start", "--block", f"--address={gcs}", "--num-cpus=0",
                '--resources={"worker_node": 10}', f"--node-ip-address={ip}", f"--temp-dir={base / f'w{attempt}'}",
                "--disable-usage-stats", *_node_ports()]

    try:
        _start_node(node2, base / "node2", env, procs)
        probe = subprocess.run([sys.executable, "-c", _PROBE, gcs, str(runs)], capture_output=True,
                               text=True, env=env, timeout=300, cwd=base)
        assert probe.returncode == 0, (probe.stdout[-2000:] + probe.stderr[-3000:]
                                       + "".join(p.read_text()[-1500:] for p in sorted(base.glob("node2-*.log"))))
        info = json.loads(probe.stdout.strip().splitlines()[-1])
        assert len(info["worker"]) == 1 and len(info["head"]) == 1, info
        # Node 2 sees nothing of the driver's run directory and cannot write into it.
        assert info["seen"] == {"node": info["worker"][0], "listed": [], "wrote": False}, info
        yield {"address": gcs, "env": env, "runs": runs, "base": base,
               "worker_node": info["worker"][0], "head_node": info["head"][0]}
    finally:
        _stop(*procs)
        shutil.rmtree(base, ignore_errors=True)


def _config(cluster: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """The tiny run of ``tests/test_train.py``: rollout workers (and any replica) pinned to node 2, 0 CPUs each."""
    pinned = {"worker_node": 1}
    base: dict[str, Any] = {
        "run": {"name": "t", "out_dir": str(cluster["runs"])},
        "ray": {"address": cluster["address"], "resources_timeout_s": 60},
        "env": {"name": "twx:coin", "max_steps": 6},
        "collect": {"policy": "mixed", "episodes": 24, "workers": 1},
        "policy": {"model": "tiny", "max_tokens": 8, "worked_example": True, "history_steps": 0,
                   "engine": {"num_cpus": 0.25, "kv_cache_gib": 0.25, "max_model_len": 2048}},
        "experience_model": {"model": "tiny", "max_tokens": 24, "max_attempts": 2, "top_k": 2,
                             "engine": {"num_cpus": 0, "kv_cache_gib": 0.25, "max_model_len": 2048,
                                        "dtype": "float32", "resources": pinned}},
        "learner": {"group_size": 3, "lr": 1e-3, "device": "cpu", "num_cpus": 0.25, "threads": 1},
        "curriculum": {"seed_tasks": 6, "tasks_per_iteration": 2, "llm_variants": 0, "param_variants": 0},
        "replay": {"num_cpus": 0.1},
        "train": {"iterations": 1, "eval": {"tasks": 3, "at_start": False}, "checkpoint_every": 1,
                  "warm_start": {"method": "none"},
                  "rollout": {"envs_per_worker": 6, "synthetic_threads": 6, "num_cpus": 0, "workers": 2,
                              "resources": pinned}},
    }
    return deep_merge(base, sections)


def _train(cluster: dict[str, Any], cfg: dict[str, Any], name: str,
           timeout: float = 1200) -> subprocess.CompletedProcess:
    path = cluster["base"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run([str(VENV_BIN / "dreamgym"), "train", str(path)], capture_output=True, text=True,
                          env=cluster["env"], timeout=timeout, cwd=cluster["base"], start_new_session=True)


def _run_dir(r: subprocess.CompletedProcess, runs: Path) -> Path:
    dirs = sorted(runs.glob("t-train-*"), key=lambda p: p.stat().st_mtime)
    assert dirs, r.stdout[-2000:] + r.stderr[-3000:]
    return dirs[-1]


def _nodes(r: subprocess.CompletedProcess, what: str) -> list[str]:
    """The node ids the driver logged for its rollout workers (``rollout worker(s)``) or replicas."""
    lines = [x for x in (r.stdout + r.stderr).splitlines() if what in x and " up " in x and "on node(s) " in x]
    assert len(lines) == 1, r.stdout[-2000:] + r.stderr[-3000:]
    return lines[0].split("on node(s) ", 1)[1].strip().split(", ")


def _iterations(run_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in records if r["event"] == "iteration"]


@pytest.mark.timeout(3000)
def test_train_on_two_nodes_reads_no_driver_local_file(two_nodes: dict[str, Any]) -> None:
    runs, worker, head = two_nodes["runs"], two_nodes["worker_node"], two_nodes["head_node"]

    # A run whose replay shards (0 CPUs: they fit on node 2) could write the run directory from node 2 is refused
    # before any work, naming the node and the role.
    r = _train(two_nodes, _config(two_nodes, replay={"num_cpus": 0}, train={"mode": "synthetic"}), "refused",
               timeout=600)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "is not shared with every node" in out and worker in out and "replay-shard" in out, out[-3000:]

    # One s2r run, a synthetic iteration then a real one: rollout workers and the experience-model replica on
    # node 2, the offline data collected into the run directory on node 1 (a driver-local path) and shipped to
    # node 2 through the object store, read there by both phases.
    r = _train(two_nodes, _config(two_nodes, train={"mode": "s2r", "iterations": 2, "synthetic_iterations": 1}),
               "s2r")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    run_dir = _run_dir(r, runs)
    assert _nodes(r, "rollout worker(s)") == _nodes(r, "experience-model replica(s)") == [worker] != [head]
    assert "run directory shared with 1 node(s)" in r.stdout + r.stderr
    iters = _iterations(run_dir)
    assert [(it["iteration"], it["phase"]) for it in iters] == [(1, "synthetic"), (2, "real")]
    # the workers ran synthetic steps: they knew every task's s_0 from the shipped offline data
    assert iters[0]["rollout"]["em_model_calls"] + iters[0]["rollout"]["em_settled"] > 0
    assert json.loads((run_dir / "summary.json").read_text())["real_transitions"] > 0
    assert any((run_dir / "checkpoints").glob("step-*/driver.json"))
    assert (run_dir / "offline.parquet").is_file()
