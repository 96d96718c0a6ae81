"""Where the test suite's time goes: per test, wall seconds and the machine's busy CPU seconds, as JSON.

The suite on a 2-core machine is bounded by CPU, not by waiting: this says by how much. For each test it records
wall time and the CPU seconds every process on the machine used meanwhile (``/proc/stat``: the test's Ray
actors, engines and servers included), and from the totals the utilisation of the machine's cores and the lower
bound on the suite's wall time if every core were busy all the time (``cpu_s / cores``): no scheduling of the
same work (pytest-xdist, sharing a core between tests) can go below it; only less work can.

    .venv/bin/python bench/bench_suite.py [-m "slow or ray or engine"] [PATHS...] [--out bench/results/suite-DATE.json]
    .venv/bin/python bench/bench_suite.py --from-log per-test.jsonl   # aggregate a log recorded before

Run it on an otherwise idle machine: the CPU seconds are the machine's, not the test's alone. The file is also the
pytest plugin that records the log (``-p bench_suite`` with ``bench/`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import emit, load_average, machine

REPO = Path(__file__).resolve().parents[1]
LOG_ENV = "BENCH_SUITE_LOG"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / _CLOCK_TICKS


# -- the pytest plugin ------------------------------------------------------------------------------------------
try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
        """Setup, call and teardown of one test, with the machine's busy CPU seconds over them."""
        t0, busy0 = time.time(), machine_busy_s()
        yield
        path = os.environ.get(LOG_ENV)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": item.nodeid, "wall_s": round(time.time() - t0, 2),
                                    "cpu_s": round(machine_busy_s() - busy0, 2)}) + "\n")
except ImportError:  # the runner needs no pytest in its own process
    pass


# -- the runner -------------------------------------------------------------------------------------------------
def summarise(rows: list[dict[str, Any]], cores: int, top: int = 20) -> dict[str, Any]:
    wall = sum(r["wall_s"] for r in rows)
    cpu = sum(r["cpu_s"] for r in rows)

    def line(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "utilisation": round(r["cpu_s"] / max(r["wall_s"], 1e-9) / cores, 2)}

    return {
        "tests": len(rows), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cores": cores,
        "utilisation": round(cpu / max(wall, 1e-9) / cores, 3),
        "wall_lower_bound_s": round(cpu / cores, 1),  # every core busy all the time, the same work
        "slowest": [line(r) for r in sorted(rows, key=lambda r: -r["wall_s"])[:top]],
        "most_cpu": [line(r) for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]],
    }


def read_log(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        r = json.loads(text)
        if not {"test", "wall_s", "cpu_s"} <= set(r):
            raise SystemExit(f"{path}:{n}: not a line of this plugin (test, wall_s, cpu_s): {text[:200]}")
        rows.append({k: r[k] for k in ("test", "wall_s", "cpu_s")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("paths", nargs="*", help="test files or node ids (default: the whole suite)")
    ap.add_argument("-m", dest="markers", default="slow or ray or engine", help="pytest -m expression")
    ap.add_argument("--from-log", type=Path, default=None, help="aggregate this per-test log instead of running")
    ap.add_argument("--note", default="", help="what else the JSON should say about this run")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    load0 = load_average()
    run: dict[str, Any]
    if args.from_log:
        rows = read_log(args.from_log)
        run = {"from_log": str(args.from_log)}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "per-test.jsonl"
            env = {**os.environ, LOG_ENV: str(log),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")]))}
            t0 = time.time()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "bench_suite", "-m", args.markers,
                                   *args.paths],
                                  cwd=REPO, env=env, capture_output=True, text=True)
            summary = next((x for x in reversed(proc.stdout.splitlines())
                            if re.search(r"\d+ (passed|failed|errors?|skipped)", x)), "")
            run = {"markers": args.markers, "paths": args.paths or ["tests"], "pytest_exit": proc.returncode,
                   "pytest_summary": summary.strip("= "),
                   "session_wall_s": round(time.time() - t0, 1)}
            rows = read_log(log) if log.exists() else []
        if not rows:
            raise SystemExit(f"pytest recorded no test (exit {proc.returncode}): {proc.stdout[-2000:]}"
                             f"{proc.stderr[-2000:]}")
    result = {
        "benchmark": "test suite: wall and machine CPU seconds per test",
        "date": datetime.date.today().isoformat(), "machine": machine(), **run,
        # a log recorded before says nothing about the load now: its run's load goes in --note
        **({} if args.from_log else {"load_average_start": load0,
                                     "load_average_end": load_average()}),
        **({"note": args.note} if args.note else {}),
        **summarise(rows, cores),
    }
    emit(result, args.out, indent=2)


if __name__ == "__main__":
    main()
