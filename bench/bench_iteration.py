"""Seconds per training iteration, split by where they go, for a fixed config (issue 13: "measure first").

Runs ``dreamgym train`` on a config (the default ``dreamgym/configs/train.yaml``, and a variant with more
episodes per iteration) in a fresh run directory and reads back what the driver already records: the
``iteration`` events of ``metrics.jsonl`` (``IterationLog``: per-phase wall times; the merged rollout counters
of the workers, with the policy's ``act_seconds``, the environments' ``env_seconds`` and, in synthesis, the
experience model's ``model_seconds`` and the replay retrieval's ``retrieval_seconds``; the learner's
``processed_tokens``). Per synthetic and per real iteration it reports, in seconds:

- ``policy_sampling``, ``experience_model`` / ``real_env``, ``retrieval``: the rollout's slowest worker wall
  time, split in proportion to those counters (they are summed over workers and environment threads, so
  only their ratios are wall-time shares);
- ``rollout_overhead``: the rollout phase's wall time the workers did not account for (launch, transfer);
- ``replay_writes``, ``learner``, ``weight_sync``: the driver's phase timers;
- ``bookkeeping``: the rest of the iteration's wall time (curriculum, metrics, launching the next one;
  evaluations and checkpoints are reported apart, not counted in);

and ``learner_tokens_per_action`` (tokens the learner processed / policy actions of the trajectories it
learned from, estimated as steps x samples / episodes), ``synthetic_transitions_per_s`` (synthetic steps /
rollout wall time).

``--baseline-commit SHA`` runs the same config (the same path in that commit's tree) on an earlier commit,
checked out in a temporary git worktree with the same virtual environment, so each speed-up is a ratio
from one run on one machine (``--current-overrides``: settings for this tree only, e.g. ones the baseline does
not have). ``--smoke``: 1 synthetic + 1 real iteration with few episodes, no experience-model
SFT and no evaluation, to show the benchmark works (not a measurement).

    .venv/bin/python bench/bench_iteration.py [--smoke] [--baseline-commit SHA] [--variants default,more]

Prints the JSON and writes it to ``bench/results/iteration-<host>-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import load_average, write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the figures of this tree's dreamgym, whatever the caller's path

from dreamgym.experience.accounting import InvalidAccounting, counts_from  # noqa: E402

DEFAULT_CONFIG = "dreamgym/configs/train.yaml"

#: ``--smoke``: the smallest run that still has one synthetic and one real iteration with a learner step.
SMOKE_OVERRIDES = [
    "--train.iterations", "2", "--train.synthetic_iterations", "1", "--train.experience_sft", "false",
    "--train.eval.enabled", "false", "--train.checkpoint_every", "0", "--collect.episodes", "8",
    "--curriculum.tasks_per_iteration", "1", "--learner.group_size", "2",
]
#: The variants of the config: overrides on top of it (``more``: twice the episodes per iteration).
VARIANTS: dict[str, list[str]] = {"default": [], "more": ["--curriculum.tasks_per_iteration", "4"]}
PHASES = ("synthetic", "real")
SPLITS = ("policy_sampling", "experience_model", "retrieval", "real_env", "rollout_overhead", "replay_writes",
          "learner", "weight_sync", "bookkeeping")


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def iteration_split(rec: dict[str, Any], wall: float) -> dict[str, float]:
    """Seconds of one ``iteration`` record by where they went (see the module docstring)."""
    phase = rec["phase"]
    ro = rec.get("rollout", {})
    ps = rec.get("phase_seconds", {})
    rollout_wall = float(ps.get(phase, rec.get("rollout_seconds", 0.0)))
    worker_wall = min(float(ro.get("seconds", 0.0)), rollout_wall)
    act, env = float(ro.get("act_seconds", 0.0)), float(ro.get("env_seconds", 0.0))
    act_share = act / (act + env) if act + env > 0 else 0.0
    env_wall = worker_wall * (1 - act_share)
    model, retrieval = float(ro.get("model_seconds", 0.0)), float(ro.get("retrieval_seconds", 0.0))
    out = dict.fromkeys(SPLITS, 0.0)
    out["policy_sampling"] = worker_wall * act_share
    if phase == "synthetic":
        # older commits record no model/retrieval split: all of the environment's time is the experience model's
        em_share = model / (model + retrieval) if model + retrieval > 0 else 1.0
        out["experience_model"] = env_wall * em_share
        out["retrieval"] = env_wall * (1 - em_share)
    else:
        out["real_env"] = env_wall
    out["rollout_overhead"] = rollout_wall - worker_wall
    out["replay_writes"] = float(ps.get("replay", 0.0))
    out["learner"] = float(ps.get("learner", 0.0))
    out["weight_sync"] = float(ps.get("sync", 0.0))
    known = sum(out.values())
    out["bookkeeping"] = max(0.0, wall - known)
    out["total"] = max(wall, known)
    return out


def summarize(run_dir: Path) -> dict[str, Any]:
    """Per-phase means over the run's iterations (see the module docstring)."""
    events = read_events(run_dir)
    per_phase: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
    prev_time: float | None = None
    for ev in events:
        if ev["event"] == "iteration":
            wall = ev["time"] - prev_time if prev_time is not None else 0.0
            split = iteration_split(ev, wall)
            ro, lm = ev.get("rollout", {}), ev.get("learner", {})
            episodes, steps = float(ro.get("episodes", 0)), float(ro.get("steps", 0))
            samples = float(lm.get("samples", 0.0))
            learned_actions = steps * samples / episodes if episodes else 0.0
            tokens = float(lm.get("processed_tokens", 0.0))
            per_phase[ev["phase"]].append({
                "iteration": ev["iteration"], "seconds": split, "episodes": episodes, "steps": steps,
                "success_rate": float(ro.get("success_rate", 0.0)),
                "invalid_transition_rate": float(ro.get("invalid_transition_rate", 0.0)),
                "learner_tokens": tokens, "learner_sequences": float(lm.get("sequences", 0.0)),
                "learner_tokens_per_action": tokens / learned_actions if tokens and learned_actions else None,
                "experience_model_tokens": (counts_from(ro).token_figures(int(steps)) if ev["phase"] == "synthetic"
                                            else None),
                "transitions_per_s": steps / split["total"] if split["total"] else 0.0,
                "rollout_transitions_per_s": steps / (split["policy_sampling"] + split["experience_model"]
                                                      + split["retrieval"] + split["real_env"] or 1.0),
            })
        # every event is written when its work ends (an evaluation, a checkpoint): the next iteration starts after
        prev_time = ev["time"]
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    for phase, items in per_phase.items():
        if not items:
            continue
        n = len(items)
        mean = {k: sum(i["seconds"][k] for i in items) / n for k in (*SPLITS, "total")}
        tpa = [i["learner_tokens_per_action"] for i in items if i["learner_tokens_per_action"] is not None]
        steps = sum(i["steps"] for i in items)
        out[phase] = {
            "iterations": n,
            "seconds_per_iteration": {k: round(v, 3) for k, v in mean.items()},
            "episodes_per_iteration": sum(i["episodes"] for i in items) / n,
            "transitions_per_iteration": steps / n,
            "transitions_per_s": steps / sum(i["seconds"]["total"] for i in items) if mean["total"] else 0.0,
            "rollout_transitions_per_s": sum(i["rollout_transitions_per_s"] for i in items) / n,
            "learner_tokens_per_action": sum(tpa) / len(tpa) if tpa else None,
            "success_rate": sum(i["success_rate"] for i in items) / n,
            "invalid_transition_rate": sum(i["invalid_transition_rate"] for i in items) / n,
            "per_iteration": items,
        }
        if phase == "synthetic":  # the experience model's tokens over the phase's iterations
            total = InvalidAccounting()
            for ev in events:
                if ev["event"] == "iteration" and ev["phase"] == phase:
                    total += counts_from(ev.get("rollout", {}))
            out[phase]["experience_model_tokens"] = total.token_figures(int(steps))
    if "synthetic" in out:
        out["synthetic_transitions_per_s"] = out["synthetic"]["transitions_per_s"]
    return out


def run_train(tree: Path, config: str, overrides: list[str], out_dir: Path, name: str, timeout_s: float) -> Path:
    """``dreamgym train`` from the source tree ``tree`` (this checkout or a baseline worktree); its run dir."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # Ray's workers inherit it: they import the same tree
    cmd = [sys.executable, "-m", "dreamgym.cli", "train", str(tree / config), "--run.out_dir", str(out_dir),
           "--run.name", name, *overrides]
    log = out_dir / f"{name}.log"
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s,
                              check=False)
    runs = sorted(out_dir.glob(f"{name}-train-*"))
    if proc.returncode != 0 or not runs:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"dreamgym train ({name}, {tree}) exited {proc.returncode} after "
                           f"{time.perf_counter() - t0:.0f} s; log tail:\n{tail}")
    return runs[-1]


def measure(tree: Path, label: str, variants: list[str], extra: list[str], out_dir: Path,
            timeout_s: float) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True,
                            check=False).stdout.strip()
    result: dict[str, Any] = {"tree": label, "commit": commit}
    for v in variants:
        t0, load_before = time.perf_counter(), os.getloadavg()
        run_dir = run_train(tree, DEFAULT_CONFIG, [*VARIANTS[v], *extra], out_dir, f"{label}-{v}", timeout_s)
        # a figure taken beside other work is noise: the load averages (1, 5, 15 min) say whether it was
        result[v] = {**summarize(run_dir), "run_seconds": round(time.perf_counter() - t0, 1),
                     "load_average_before": [round(x, 2) for x in load_before],
                     "load_average_after": load_average()}
    return result


def ratios(base: dict[str, Any], cur: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """``baseline / current`` of seconds per iteration (a speed-up) and of learner tokens per action."""
    out: dict[str, Any] = {}
    for v in variants:
        for phase in PHASES:
            b, c = base.get(v, {}).get(phase), cur.get(v, {}).get(phase)
            if not b or not c:
                continue
            bs, cs = b["seconds_per_iteration"], c["seconds_per_iteration"]
            r = {k: round(bs[k] / cs[k], 3) for k in bs if cs.get(k)}
            if b["learner_tokens_per_action"] and c["learner_tokens_per_action"]:
                r["learner_tokens_per_action"] = round(
                    b["learner_tokens_per_action"] / c["learner_tokens_per_action"], 3)
            out[f"{v}/{phase}"] = r
    return out


def new_over_old(base: dict[str, Any], cur: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """``current / baseline`` of synthetic transitions per second (the first variant at the top level, each variant
    under its name), the form the issues' targets are written in."""
    out: dict[str, Any] = {}
    for v in variants:
        b, c = base.get(v, {}).get("synthetic_transitions_per_s"), cur.get(v, {}).get("synthetic_transitions_per_s")
        if b and c:
            out.setdefault("synthetic_transitions_per_s", round(c / b, 3))
            out[v] = {"synthetic_transitions_per_s": round(c / b, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="default,more", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--baseline-commit", default=None, help="also run the same config at this commit (a worktree)")
    ap.add_argument("--smoke", action="store_true", help="1 synthetic + 1 real iteration, few episodes")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per training run")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/iteration-<host>-<date>.json)")
    ap.add_argument("--current-overrides", default="", help="overrides for this tree only, space-separated "
                    "(settings the baseline commit does not know, e.g. '--experience_model.speculative_tokens 4')")
    ap.add_argument("overrides", nargs="*", help="extra `--section.field VALUE` overrides (after `--`)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}")
    if args.smoke:
        variants = variants[:1]
    extra = [*(SMOKE_OVERRIDES if args.smoke else []), *args.overrides]

    work = Path(tempfile.mkdtemp(prefix="bench-iteration-"))
    out: dict[str, Any] = {
        "bench": "iteration", "host": socket.gethostname(), "cpus": os.cpu_count(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "config": DEFAULT_CONFIG,
        "variants": {v: VARIANTS[v] for v in variants}, "smoke": args.smoke, "overrides": extra,
        "current_overrides": args.current_overrides.split(),
    }
    try:
        out["current"] = measure(REPO, "current", variants, [*extra, *args.current_overrides.split()], work,
                                 args.timeout_s)
        if args.baseline_commit:
            with baseline_tree(args.baseline_commit, work) as worktree:
                out["baseline"] = measure(worktree, "baseline", variants, extra, work, args.timeout_s)
            out["speedup"] = ratios(out["baseline"], out["current"], variants)
            out["ratios"] = new_over_old(out["baseline"], out["current"], variants)
    finally:
        if args.keep:
            print(f"run directories kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    write_result(out, "iteration", args.out)


@contextlib.contextmanager
def baseline_tree(commit: str, work: Path) -> Iterator[Path]:
    """``commit`` checked out in a temporary git worktree under ``work``, removed afterwards: run with this
    checkout's virtual environment and ``PYTHONPATH`` pointing at it, it is the baseline arm of a side-by-side run."""
    worktree = work / "baseline-tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), commit], cwd=REPO, check=True,
                   capture_output=True)
    try:
        yield worktree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False,
                       capture_output=True)



if __name__ == "__main__":
    main()
