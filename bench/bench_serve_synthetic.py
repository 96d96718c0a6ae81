"""Throughput of the served synthetic environment against the in-process ``SyntheticEnv``, as a ratio in one run.

Both sides are the same simulator: real ``twx:coin`` transitions collected here (TextWorldExpress) index the
tasks, first states, valid actions and retrieval store, and the same experience model backend answers (default
``copy``, the copy-top-1 simulator). ``--sessions`` threads each play their own episodes with a seeded random
valid-action policy, ``--steps`` steps each:

- in process: each thread steps its own ``SyntheticEnv`` (``SyntheticParts.make``: shared model and index);
- served: ``dreamgym serve-synthetic`` in a subprocess on loopback, each thread with its own ``RemoteEnv``
  (``remote:dreamgym``), the client a trainer would use.

The two sides are measured ``--rounds`` times, alternating, and the JSON reports steps/s of each and
``ratio = served / in-process`` (the issue's goal: at least 0.8). With the ``copy`` backend a step costs well
under a millisecond in process, so the ratio is the HTTP round trip's overhead at its worst; with a model
(``--backend local --model FOLDER``) the model's time dominates both sides. Every served trajectory is also
checked equal to the in-process one (same actions, same states): a fast server that crossed sessions would fail
(with the deterministic ``copy`` backend; a vLLM engine's greedy replies may differ with the batch, so there the
JSON only says whether they were equal).

    .venv/bin/python bench/bench_serve_synthetic.py [--sessions 16 --steps 150 --episodes 60]
    .venv/bin/python bench/bench_serve_synthetic.py --backend local --model tiny --steps 10 --em-overrides \
        "--experience_model.max_tokens 32 --experience_model.max_attempts 1 --experience_model.top_k 1 \
         --experience_model.demo_state_max_chars 300 --experience_model.engine.kv_cache_gib 0.25 \
         --experience_model.engine.max_model_len 2048"
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from benchlib import machine

from dreamgym.collect import collect_range
from dreamgym.config import DreamGymConfig, EnvConfig, deep_merge, parse_overrides, validate_config
from dreamgym.data.transitions import TransitionWriter
from dreamgym.envs.base import Environment
from dreamgym.envs.registry import make_env
from dreamgym.envs.remote import RemoteEnv
from dreamgym.experience.serve import open_synthetic
from dreamgym.policies import make_policy
from dreamgym.types import Task

ENV = "twx:coin"


def play(make: Callable[[int], Environment], tasks: list[Task], sessions: int, steps: int) -> tuple[float, list[Any]]:
    """``sessions`` threads, each stepping its own environment ``steps`` times (a new episode when one ends);
    returns the wall time from the common start to the last step and every session's trajectory."""
    gate = threading.Barrier(sessions + 1)
    traces: list[Any] = [None] * sessions
    ends: list[float] = [0.0] * sessions

    def session(i: int) -> None:
        rng, env, trace = random.Random(i), make(i), []
        try:
            gate.wait()
            n, episode = 0, 0
            while n < steps:
                obs = env.reset(tasks[(i + episode * sessions) % len(tasks)])
                episode += 1
                valid = obs.admissible_actions or ["look around"]
                done = False
                while not done and n < steps:
                    action = rng.choice(valid)
                    r = env.step(action)
                    trace.append((action, r.observation.state, r.reward, r.done))
                    n, done = n + 1, r.done
                    valid = r.observation.admissible_actions or valid
            ends[i] = time.perf_counter()
            traces[i] = trace
        finally:
            env.close()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if any(tr is None for tr in traces):
        raise RuntimeError("a session failed (see the traceback above)")
    return max(ends) - t0, traces


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(data: Path, cfg: DreamGymConfig, log: Path,
                 overrides: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    em = cfg.experience_model
    argv = [str(Path(sys.executable).parent / "dreamgym"), "serve-synthetic", "--env", ENV, "--offline-data", str(data),
            "--backend", em.backend, "--model", em.model, "--env.max_steps", str(cfg.env.max_steps),
            "--port", str(port), *overrides]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while "serving synthetic:" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"serve-synthetic did not start:\n{log.read_text()}")
        time.sleep(0.2)
    return proc, url



def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--steps", type=int, default=150, help="steps per session per measurement")
    ap.add_argument("--episodes", type=int, default=60, help="real twx:coin episodes behind the simulator")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--backend", default="copy", choices=("copy", "local", "http"))
    ap.add_argument("--model", default="copy-top-1", help="the model for --backend local/http")
    ap.add_argument("--em-overrides", default="", help="config overrides for both sides, one string "
                    "('--experience_model.max_tokens 32 ...')")
    ap.add_argument("--out", default=None,
                    help="JSON path (default bench/results/serve-synthetic-<backend>-<date>.json)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "coin.parquet"
        real = make_env(EnvConfig(name=ENV))
        try:
            transitions, _ = collect_range(real, make_policy("mixed", 0.5), 0, args.episodes, "train", 0, "bench")
        finally:
            real.close()
        with TransitionWriter(data) as w:
            w.write(transitions)
        em: dict[str, Any] = {"backend": args.backend, "top_k": 3}
        if args.backend != "copy":
            em["model"] = args.model
        overrides = ["--experience_model.top_k", "3", *shlex.split(args.em_overrides)]
        cfg = validate_config(deep_merge({"env": {"name": ENV, "max_steps": 8}, "train": {"offline_data": str(data)},
                                          "experience_model": em}, parse_overrides(overrides)))
        parts = open_synthetic(cfg)
        tasks = parts.index.tasks()
        proc, url = start_server(data, cfg, Path(tmp) / "server.log", overrides)
        try:
            def remote(i: int) -> Environment:
                return RemoteEnv("dreamgym", url, timeout_s=600)

            play(lambda i: parts.make(cfg), tasks, args.sessions, 5)  # warm both sides (imports, caches, pools)
            play(remote, tasks, args.sessions, 5)
            rounds = []
            for _ in range(args.rounds):
                local_s, local_traces = play(lambda i: parts.make(cfg), tasks, args.sessions, args.steps)
                served_s, served_traces = play(remote, tasks, args.sessions, args.steps)
                equal = served_traces == local_traces
                if not equal and args.backend == "copy":
                    raise RuntimeError("a served trajectory differs from the in-process one for the same actions")
                n = args.sessions * args.steps
                rounds.append({"steps": n, "in_process_s": round(local_s, 4), "served_s": round(served_s, 4),
                               "in_process_steps_per_s": round(n / local_s, 1),
                               "served_steps_per_s": round(n / served_s, 1), "ratio": round(local_s / served_s, 4),
                               "trajectories_equal": equal})
            metrics = requests.get(url + "/metrics", timeout=30).json()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            parts.close()
    result = {
        "benchmark": "serve-synthetic throughput: served (HTTP, remote:dreamgym) vs in-process SyntheticEnv",
        "date": datetime.date.today().isoformat(), "machine": machine(),
        "setup": {"env": ENV, "backend": args.backend, "model": args.model if args.backend != "copy" else "copy-top-1",
                  "real_episodes": args.episodes, "transitions": parts.index.size, "tasks": len(tasks),
                  "sessions": args.sessions, "steps_per_session": args.steps, "rounds": args.rounds,
                  "policy": "seeded random valid action per session", "overrides": overrides,
                  "invalid_rate": parts.model.stats.as_dict()["invalid_rate"]},
        "rounds": rounds,
        "ratio_median": round(statistics.median(r["ratio"] for r in rounds), 4),
        "goal_ratio": 0.8,
        "server_latency_s": metrics["latency_s"],
    }
    out = Path(args.out or f"bench/results/serve-synthetic-{args.backend}-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
