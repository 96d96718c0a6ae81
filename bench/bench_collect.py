"""Benchmark of ``dreamgym collect``: transitions/s and peak memory, printed as JSON.

Runs the real collection (local Ray, real TextWorldExpress) on ``twx:coin`` with the random policy
and reports overall throughput (from the first batch request to the last write), steady-state
throughput (after the first batch of every worker, i.e. with the JVMs warm), and the peak resident
memory of the driver and of the collection workers with their JVMs (sampled every 0.2 s).

Target (issue 2): at least 1,000 transitions/s on a 2-core machine.

    .venv/bin/python bench/bench_collect.py [--episodes 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time

import psutil


def _worker_tree_rss() -> tuple[int, int]:
    """RSS of the driver, and of all collection actors plus their child JVMs."""
    me = psutil.Process()
    driver = me.memory_info().rss
    workers = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "CollectWorker" in cmd:
                workers += p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return driver, workers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=4000)
    ap.add_argument("--env", default="twx:coin")
    args = ap.parse_args()

    from actors.collect import run_collect
    from dreamgym.config import load_config
    from dreamgym.runs import MetricsLog

    peak = {"driver": 0, "workers": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            d, w = _worker_tree_rss()
            peak["driver"] = max(peak["driver"], d)
            peak["workers"] = max(peak["workers"], w)
            time.sleep(0.2)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, ["--env.name", args.env, "--collect.policy", "random", "--collect.episodes",
                                 str(args.episodes), "--run.out_dir", tmp])
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        summary = run_collect(cfg, progress=False)
        stop.set()
        t.join()
        batches = [r for r in MetricsLog(summary["run_dir"]).read() if r.get("event") == "batch"]
        file_mb = os.path.getsize(summary["out"]) / 2**20
    warm = batches[summary["workers"] - 1] if len(batches) > summary["workers"] else batches[0]
    last = batches[-1]
    steady = (last["transitions"] - warm["transitions"]) / max(last["elapsed_s"] - warm["elapsed_s"], 1e-9)
    print(json.dumps({
        "bench": "collect",
        "env": args.env,
        "policy": "random",
        "episodes": summary["episodes"],
        "transitions": summary["transitions"],
        "workers": summary["workers"],
        "cpus": os.cpu_count(),
        "elapsed_s": round(summary["elapsed_s"], 2),
        "transitions_per_s": round(summary["transitions_per_s"], 1),
        "steady_transitions_per_s": round(steady, 1),
        "target_transitions_per_s": 1000,
        "meets_target": summary["transitions_per_s"] >= 1000,
        "peak_rss_driver_mb": round(peak["driver"] / 2**20, 1),
        "peak_rss_workers_incl_jvm_mb": round(peak["workers"] / 2**20, 1),
        "parquet_mb": round(file_mb, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
