"""Start-up cost of the processes every run (and most tests) starts, old way against new, as ratios in one run.

- ``encoder_load``: a replay shard's ``phi(s, a)`` encoder, from a fresh process to the first vector: through
  sentence-transformers (old) against the plain-torch BERT of ``dreamgym.replay.bert`` (new, the packaged model).
- ``engine_start``: a tiny policy engine (``VllmPolicy``) from a fresh process to ready, with the import garbage
  left to vLLM's ``gc.collect`` calls (old) against frozen first (new, ``freeze_import_garbage``).

Each measurement is a fresh Python process (imports are most of the cost); the two arms alternate ``--rounds``
times. Wall and CPU seconds per arm, medians, and ``ratios`` new / old.

    .venv/bin/python bench/bench_startup.py [--rounds 3] [--out bench/results/startup-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchlib import emit, load_average, machine

REPO = Path(__file__).resolve().parents[1]

ENCODER = """
import json, resource, sys, time
t0 = time.perf_counter()
from dreamgym.replay.encoder import Encoder, default_model_dir
if sys.argv[1] == "old":
    from sentence_transformers import SentenceTransformer
    m = SentenceTransformer(str(default_model_dir()), device="cpu")
    m.encode(["take coin"], convert_to_numpy=True)
else:
    Encoder(dtype="float32").encode_texts(["take coin"])
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": u.ru_utime + u.ru_stime}))
"""

ENGINE = """
import json, resource, sys, time
t0 = time.perf_counter()
import dreamgym.vllm_engine as ve
from dreamgym.config import validate_config
if sys.argv[1] == "old":
    ve.freeze_import_garbage = lambda: None
cfg = validate_config({"policy": {"model": "tiny", "max_tokens": 8,
                                  "engine": {"kv_cache_gib": 0.25, "max_model_len": 2048}}})
engine = ve.VllmPolicy(cfg.policy)
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": u.ru_utime + u.ru_stime}))
"""


def measure(code: str, arm: str) -> dict[str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
    r = subprocess.run([sys.executable, "-c", code, arm], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{arm}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(code: str, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for i in range(rounds):
        for arm in (("old", "new") if i % 2 == 0 else ("new", "old")):  # alternate: drift hits both arms
            runs[arm].append(measure(code, arm))
            print(f"  {arm}: {runs[arm][-1]}", file=sys.stderr)
    med = {arm: {k: round(statistics.median(r[k] for r in rs), 2) for k in ("wall_s", "cpu_s")}
           for arm, rs in runs.items()}
    return {"median": med, "runs": runs,
            "ratio_wall": round(med["new"]["wall_s"] / med["old"]["wall_s"], 3),
            "ratio_cpu": round(med["new"]["cpu_s"] / med["old"]["cpu_s"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    load0 = load_average()
    print("encoder load", file=sys.stderr)
    encoder = compare(ENCODER, args.rounds)
    print("engine start", file=sys.stderr)
    engine = compare(ENGINE, args.rounds)
    result = {
        "benchmark": "process start-up: replay encoder load and policy-engine start, old vs new",
        "date": datetime.date.today().isoformat(), "machine": machine(), "rounds": args.rounds,
        "load_average_start": load0, "load_average_end": load_average(),
        "encoder_load": encoder, "engine_start": engine,
        "ratios": {"encoder_load_wall": encoder["ratio_wall"], "encoder_load_cpu": encoder["ratio_cpu"],
                   "engine_start_wall": engine["ratio_wall"], "engine_start_cpu": engine["ratio_cpu"]},
    }
    emit(result, args.out, indent=2)


if __name__ == "__main__":
    main()
