"""A soak run: ``dreamgym train`` for a fixed wall time while its actors are killed one after another.

Starts ``dreamgym train`` (the packaged default config unless ``--config``; extra ``--section.field VALUE``
overrides after ``--``) as a subprocess in its own session, with enough iterations to outlast the soak. Once
the run's first evaluation has ended, every ``--kill-every`` seconds it sends SIGKILL to the next actor process
of the cycle rollout worker -> experience-model replica -> replay shard -> policy engine (found among the run's
own descendants, as ``kill -9`` would; a role without a live process is skipped and noted). With ``--freeze``
the cycle covers every actor kind (curriculum and learner included), each killed once and frozen once
(SIGSTOP: the run's watchdog must find it, ``train.watchdog``, and replace it; a frozen process the run has not
replaced after ``--freeze-for`` seconds gets SIGCONT, and the JSON says which were replaced). Every
``--sample-every`` seconds it records the resident memory of each process group: each Ray actor with its child
processes (vLLM engine cores, the TextWorldExpress JVM), the driver, Ray's own daemons and idle workers. After
``--minutes`` the run gets SIGTERM (it stops like Ctrl-C) and the benchmark reads its ``metrics.jsonl``:
iterations completed, transitions the replay buffer acknowledged, invalid synthetic transitions, the faults
and automatic resumes, rollout workers lost; and the memory of each group over time, with the growth of the
peaks from the middle to the last third of the soak (after training began).

    .venv/bin/python bench/soak.py [--minutes 30] [--kill-every 300] [--freeze] [--config FILE] [-- --train.x y ...]

Prints the JSON and writes it to ``bench/results/soak-<host>-<date>.json``; the run directory stays under
``runs/soak/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from bench_iteration import REPO
from benchlib import write_result

#: The kill cycle: the Ray actor class names of the parts a fault may take out.
KILL_CYCLE = ("RolloutWorker", "ExperienceModelReplica", "ReplayShard", "PolicyEngine")

#: The cycle with ``--freeze``: every actor kind killed once and frozen once (SIGSTOP: alive, never answering,
#: as a wedged GPU kernel or a node behind a partition), kills and freezes interleaved.
FAULT_CYCLE = (("kill", "RolloutWorker"), ("freeze", "PolicyEngine"), ("kill", "ExperienceModelReplica"),
               ("freeze", "ExperienceModelReplica"), ("kill", "ReplayShard"), ("freeze", "RolloutWorker"),
               ("kill", "CurriculumActor"), ("freeze", "CurriculumActor"), ("kill", "PolicyEngine"),
               ("freeze", "LearnerActor"), ("kill", "LearnerActor"), ("freeze", "ReplayShard"))

#: ``--freeze``: the hang bounds of the run, short enough for a frozen actor to be found within a soak's fault
#: interval and still far above the default run's slowest call on a 2-core CPU (a GRPO step: a few minutes).
FREEZE_OVERRIDES = ["--train.watchdog.engine_s", "120", "--train.watchdog.worker_s", "900",
                    "--train.watchdog.curriculum_s", "300", "--train.watchdog.learner_s", "900",
                    "--experience_model.request_timeout_s", "180", "--replay.call_timeout_s", "180"]

#: Overrides that make the default run outlast the soak: many iterations, half of them in synthesis (so the
#: experience-model replicas live), no real-transition budget, resumes enough for an engine kill each cycle.
SOAK_OVERRIDES = ["--train.iterations", "400", "--train.synthetic_iterations", "200", "--train.real_budget",
                  "1000000", "--train.auto_resume", "50", "--run.name", "soak"]


def actor_name(p: psutil.Process) -> str | None:
    """``RolloutWorker`` for a process titled ``ray::RolloutWorker.run`` (Ray names actor processes so)."""
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if not cmd.startswith("ray::"):
        return None
    return cmd[len("ray::"):].split()[0].split(".")[0]


def memory_groups(root: psutil.Process) -> dict[str, float]:
    """Resident MiB per group: each named Ray actor class (summed over its processes and their children), the
    driver, ``ray-idle`` workers and ``ray-system`` (raylet, GCS and the rest)."""
    groups: dict[str, float] = {}
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return groups
    owner: dict[int, str] = {root.pid: "driver"}
    for p in procs[1:]:  # parents come before their children in psutil's order
        name = actor_name(p)
        try:
            parent = p.ppid()
        except psutil.NoSuchProcess:
            continue
        if name and name != "IDLE":
            owner[p.pid] = name
        elif name == "IDLE":
            owner[p.pid] = "ray-idle"
        elif owner.get(parent, "ray-system") not in ("driver", "ray-system", "ray-idle"):
            owner[p.pid] = owner[parent]  # a child of an actor (vLLM engine core, JVM) counts with it
        else:
            owner[p.pid] = "ray-system"
    for p in procs:
        try:
            rss = p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            continue
        key = owner.get(p.pid, "ray-system")
        groups[key] = groups.get(key, 0.0) + rss
    return {k: round(v, 1) for k, v in sorted(groups.items())}


def kill_one(root: psutil.Process, role: str) -> dict[str, Any]:
    """SIGKILL the oldest live ``ray::<role>`` process under ``root``."""
    found = [p for p in root.children(recursive=True) if actor_name(p) == role]
    if not found:
        return {"role": role, "killed": False, "why": "no live process"}
    victim = min(found, key=lambda p: p.create_time())
    victim.kill()
    return {"role": role, "killed": True, "pid": victim.pid, "alive_of_role": len(found)}


def freeze_one(root: psutil.Process, role: str) -> dict[str, Any]:
    """SIGSTOP the oldest live ``ray::<role>`` process under ``root``; ``thaw`` later lets it go on if the run
    has not killed it by then (the run should: its watchdog finds it and the process is replaced)."""
    found = []
    for p in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if actor_name(p) == role and p.status() != psutil.STATUS_STOPPED:
                found.append(p)
    if not found:
        return {"role": role, "frozen": False, "why": "no live process"}
    victim = min(found, key=lambda p: p.create_time())
    victim.suspend()
    return {"role": role, "frozen": True, "pid": victim.pid, "alive_of_role": len(found)}


def thaw(fault: dict[str, Any], now: float) -> None:
    """End a freeze: note whether the run replaced the frozen process (gone or a zombie), then SIGCONT it."""
    try:
        p = psutil.Process(fault["pid"])
        gone = p.status() == psutil.STATUS_ZOMBIE
        if not gone:
            p.resume()
    except psutil.NoSuchProcess:
        gone = True
    fault["replaced_by_the_run"] = gone
    fault["thawed_at"] = round(now, 1)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run did, from its own records (an iteration that ran twice after a resume counts twice)."""
    iters = [r for r in records if r["event"] == "iteration"]
    seeded = sum(int(r.get("stored", 0)) for r in records if r["event"] == "replay_seed")
    stored = sum(int(r.get("replay", {}).get("stored", 0)) for r in iters)
    invalid = sum(int(r.get("rollout", {}).get("invalid_transitions", 0)) for r in iters)
    synthetic_steps = sum(int(r.get("rollout", {}).get("steps", 0)) for r in iters if r.get("phase") == "synthetic")
    return {
        "iterations_recorded": len(iters),
        "last_iteration": max((int(r["iteration"]) for r in iters), default=0),
        "iterations_by_phase": {p: sum(1 for r in iters if r.get("phase") == p) for p in ("synthetic", "real")},
        "learner_steps": sum(1 for r in iters if not r.get("learner", {}).get("skipped")),
        "replay_seeded": seeded,
        "replay_stored_by_iterations": stored,
        "synthetic_transitions": synthetic_steps,
        "invalid_synthetic_transitions": invalid,
        "faults": [r.get("what") for r in records if r["event"] == "fault"],
        "auto_resumes": sum(1 for r in records if r["event"] == "auto_resume"),
        "rollout_workers_lost": sum(1 for r in records if r["event"] == "rollout_worker_lost"),
        "hung_reports": [r.get("what") for r in records if r["event"] == "actor_hung"],
        "guard_trips": sum(1 for r in records if r["event"] == "guard" and r.get("tripped")),
    }


def growth(samples: list[dict[str, Any]], since: float) -> dict[str, Any]:
    """Peak resident memory per group and in all, in the middle third of the soak (after ``since``, when training
    began) against the last third. Peaks, not means: the learner's memory rises during each step and falls
    after it, and a killed actor restarts small, so only a peak that keeps rising is growth."""
    after = [s for s in samples if s["t"] >= since]
    if len(after) < 9:
        return {"samples": len(after), "ratio": None}
    third = len(after) // 3
    middle, last = after[third:2 * third], after[2 * third:]
    groups = sorted({k for s in after for k in s["mib"]})

    def peak(window: list[dict[str, Any]], key: str | None = None) -> float:
        return max((sum(s["mib"].values()) if key is None else s["mib"].get(key, 0.0)) for s in window)

    return {"samples": len(after), "windows_s": [middle[0]["t"], last[0]["t"], last[-1]["t"]],
            "middle_third_peak_mib": round(peak(middle), 1), "last_third_peak_mib": round(peak(last), 1),
            "ratio": round(peak(last) / peak(middle), 3),
            "by_group": {g: {"middle_peak_mib": round(peak(middle, g), 1), "last_peak_mib": round(peak(last, g), 1)}
                         for g in groups}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--kill-every", type=float, default=300.0, help="seconds between faults (kills or freezes)")
    ap.add_argument("--freeze", action="store_true",
                    help="freeze actors too (SIGSTOP), every actor kind killed once and frozen once per cycle, with "
                         "hang bounds short enough to find a freeze between two faults (FREEZE_OVERRIDES)")
    ap.add_argument("--freeze-for", type=float, default=None,
                    help="seconds before a frozen process gets SIGCONT if the run has not replaced it "
                         "(default: --kill-every)")
    ap.add_argument("--sample-every", type=float, default=15.0, help="seconds between memory samples")
    ap.add_argument("--config", default=None, help="config file (default: the packaged default run)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/soak-<host>-<date>.json)")
    args = ap.parse_args(argv)

    out_dir = REPO / "runs" / "soak"
    cmd = [str(Path(sys.executable).parent / "dreamgym"), "train", *([args.config] if args.config else []),
           *SOAK_OVERRIDES, *(FREEZE_OVERRIDES if args.freeze else []), "--run.out_dir", str(out_dir), *extra]
    cycle_of = FAULT_CYCLE if args.freeze else tuple(("kill", r) for r in KILL_CYCLE)
    freeze_for = args.freeze_for if args.freeze_for is not None else args.kill_every
    before = set(out_dir.glob("soak-train-*")) if out_dir.exists() else set()
    log_path = REPO / "runs" / "soak.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    root = psutil.Process(proc.pid)
    samples: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    run_dir: Path | None = None
    training_since: float | None = None
    next_sample, next_kill, cycle = 0.0, float("inf"), 0
    end = t0 + args.minutes * 60
    print(f"soak: {' '.join(cmd)} (log {log_path})", flush=True)
    try:
        while time.time() < end and proc.poll() is None:
            now = time.time()
            if run_dir is None:
                fresh = sorted(set(out_dir.glob("soak-train-*")) - before) if out_dir.exists() else []
                run_dir = fresh[-1] if fresh else None
            if training_since is None and run_dir is not None and any(
                    r["event"] in ("eval", "iteration") for r in read_metrics(run_dir)):
                training_since = now
                next_kill = now + args.kill_every
                print(f"soak: training began at {now - t0:.0f} s; first kill in {args.kill_every:.0f} s", flush=True)
            if now >= next_sample:
                samples.append({"t": round(now - t0, 1), "mib": memory_groups(root)})
                next_sample = now + args.sample_every
                if len(samples) % 8 == 0:  # one status line every 8 samples
                    done = summarise(read_metrics(run_dir)) if run_dir else {}
                    print(f"soak: {(now - t0) / 60:.1f} min, iteration {done.get('last_iteration', 0)}, "
                          f"{len(kills)} kill(s), tree {sum(samples[-1]['mib'].values()):.0f} MiB", flush=True)
            for k in kills:
                if k.get("frozen") and "thawed_at" not in k and now - t0 >= k["t"] + freeze_for:
                    thaw(k, now - t0)
                    print(f"soak: thawed {k}", flush=True)
            if now >= next_kill:
                action, role = cycle_of[cycle % len(cycle_of)]
                k = kill_one(root, role) if action == "kill" else freeze_one(root, role)
                k["t"] = round(now - t0, 1)
                kills.append(k)
                print(f"soak: {k}", flush=True)
                cycle += 1
                next_kill = now + args.kill_every
            time.sleep(1.0)
    finally:
        for k in kills:  # never leave a stopped process behind
            if k.get("frozen") and "thawed_at" not in k:
                thaw(k, time.time() - t0)
        ended_itself = proc.poll() is not None
        if not ended_itself:
            proc.send_signal(signal.SIGTERM)  # the driver stops like Ctrl-C and takes its Ray down with it
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    records = read_metrics(run_dir) if run_dir else []
    result = {
        "command": cmd, "run_dir": str(run_dir), "minutes": round((time.time() - t0) / 60, 1),
        "exit_code": code, "ended_by_itself": ended_itself, "kill_every_s": args.kill_every,
        "load_average_end": os.getloadavg(), "kills": kills, "run": summarise(records),
        "memory_growth": growth(samples, training_since - t0 if training_since is not None else 0.0),
        "memory_samples": samples,
    }
    write_result(result, "soak", args.out)
    return result


if __name__ == "__main__":
    main()
