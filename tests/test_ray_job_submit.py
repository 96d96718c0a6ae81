"""``ray job submit`` against a real Ray head started on loopback by this test.

The head runs in the foreground (``ray start --head --block``) in its own process group, so the test
stops exactly the cluster it started (no machine-wide ``ray stop``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """One head for the module's jobs: starting one takes ~15 s and stopping it ~30 s, and the jobs run one after
    another, each cleaning up its own actors when it ends."""
    tmp_path = tmp_path_factory.mktemp("ray-head")
    gcs, dash = _free_port(), _free_port()
    # Ray 2.60 clusters require token authentication; the head and the job client share a fresh token.
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    log = (tmp_path / "head.log").open("w")
    head = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
         "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         "--include-dashboard=true", "--disable-usage-stats",
         # Every agent port explicit and free: the defaults (e.g. 52365) are taken by any other Ray on this
         # machine (the session fixture's), and then the job agent never starts.
         f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
         f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
         f"--ray-client-server-port={_free_port()}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            if head.poll() is not None:
                pytest.fail(f"ray head exited: {(tmp_path / 'head.log').read_text()[-2000:]}")
            r = subprocess.run([str(VENV_BIN / "ray"), "job", "list", "--address", address],
                               capture_output=True, text=True, env=env)
            if r.returncode == 0:
                break
            time.sleep(2)
        else:
            pytest.fail("ray head did not answer within 180 s")
        yield address, env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            # A graceful stop takes ~30 s and a wait of 10 s always ended in the kill below: the whole group (head,
            # raylet, workers) is ours, so it gets 2 s.
            head.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        log.close()


def _ray(*args: str, env: dict[str, str], timeout: float = 120) -> str:
    # The head's job agent comes up a few seconds after the dashboard answers: retry only that.
    for _ in range(90):
        r = subprocess.run([str(VENV_BIN / "ray"), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if "No available agent" not in r.stderr:
            break
        time.sleep(2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout + r.stderr


def _submit(address: str, args: list[str], env: dict[str, str], timeout: float) -> str:
    """``ray job submit`` as a user runs it: it tails the job's logs until the job ends (exit 1 if it failed).
    Asserts that the job succeeded and returns the output, the job's logs included. (Polling ``ray job status``
    instead started a ``ray`` process every few seconds beside the job on a 2-core machine.)

    Ray 2.60 prints the end state in lower case ("Job 'raysubmit_x' succeeded"), older releases as
    "SUCCEEDED": both are matched.
    """
    out = _ray("job", "submit", "--address", address, *args, env=env, timeout=timeout)
    assert re.search(r"Job '(raysubmit_\w+)' succeeded", out, re.IGNORECASE), out[-3000:]
    return out


@pytest.mark.slow
def test_collect_job_succeeds(ray_head, tmp_path) -> None:
    from dreamgym.data.transitions import summarise

    address, env = ray_head
    out = tmp_path / "job.parquet"
    runtime_env = {"env_vars": {"HF_HUB_OFFLINE": "1", "DREAMGYM_JOB_MARK": "from-runtime-env"}}
    logs = _submit(address, ["--runtime-env-json", json.dumps(runtime_env), "--", str(VENV_BIN / "dreamgym"), "collect",
                             "--env", "twx:coin", "--episodes", "16", "--out", str(out),
                             "--run.out_dir", str(tmp_path / "runs")], env, timeout=600)
    assert summarise(out)["episodes"] == 16
    # The job joined the cluster it was submitted to instead of starting a Ray of its own.
    assert "existing Ray session" in logs or "Ray cluster at" in logs, logs[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.engine
def test_train_job_succeeds(ray_head, tmp_path) -> None:
    import yaml
    from test_train import tiny_config

    address, env = ray_head
    # The smallest real run: no offline collection and no evaluation (neither differs inside a job).
    cfg = tiny_config(tmp_path / "runs", collect={"episodes": 0},
                      train={"mode": "real", "iterations": 1, "warm_start": {"method": "none"},
                             "eval": {"enabled": False}})
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    runtime_env = {"env_vars": {"HF_HUB_OFFLINE": "1", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}}
    logs = _submit(address, ["--runtime-env-json", json.dumps(runtime_env), "--", str(VENV_BIN / "dreamgym"), "train",
                             str(tmp_path / "train.yaml")], env, timeout=1500)
    assert "existing Ray session" in logs or "Ray cluster at" in logs, logs[-2000:]
    (run_dir,) = (tmp_path / "runs").glob("t-train-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 1 and summary["real_transitions"] > 0
    assert (run_dir / "report.md").is_file()


@pytest.mark.slow
def test_dry_run_job_with_an_uploaded_config(ray_head, tmp_path) -> None:
    """The cluster/README.md recipe: a folder holding only the config goes up with ``--working-dir`` and
    ``dreamgym train CONFIG --dry-run`` checks the plan against the live cluster it was submitted to."""
    import yaml

    address, env = ray_head
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    small = {"num_cpus": 0.25}
    (job_dir / "my-config.yaml").write_text(yaml.safe_dump({
        "run": {"name": "uploaded"}, "policy": {"engine": small}, "experience_model": {"engine": small},
        "learner": small, "replay": {"num_cpus": 0.1}, "train": {"rollout": {"workers": 1, "num_cpus": 0.1}}}))
    runtime_env = {"env_vars": {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}}
    logs = _submit(address, ["--working-dir", str(job_dir), "--runtime-env-json", json.dumps(runtime_env),
                             "--", str(VENV_BIN / "dreamgym"), "train", "my-config.yaml", "--dry-run"], env,
                   timeout=300)
    assert "total: " in logs and "fits the Ray cluster at" in logs and "(2 CPUs, 0 GPUs" in logs, logs[-2000:]
