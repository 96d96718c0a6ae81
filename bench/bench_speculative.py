"""Prompt-lookup speculative decoding of the experience model: the same replies in less engine time?

Sends the same experience-model prompts (held-out real transitions with their demonstrations and history, as
``bench_experience_model.py`` builds them) to the raw in-process engine, in batches of ``--concurrency`` with the
served sampling (greedy, the reply's stop string, ``--max-tokens``), once per setting of
``experience_model.speculative_tokens`` (prompt-lookup draft tokens, 0: off), each in its own process (one engine
at a time), and reports per setting the wall time,
generated tokens per second, prefix-cache hits, the engine's steps and mean batch (``Completion.engine_*``), and
how many replies differ from the first setting's (greedy decoding with verification writes the same tokens; a few
may differ where batched float sums round differently).

    .venv/bin/python bench/bench_speculative.py --model RUN/experience_model --data RUN/offline.parquet \\
        --settings 0,4,8 --queries 48 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_experience_model import _batches
from benchlib import emit

from dreamgym.config import EngineConfig, ExperienceModelConfig
from dreamgym.experience.accounting import InvalidAccounting
from dreamgym.experience.evaluate import build_items
from dreamgym.experience.prompts import STOP, build_messages
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.schema import Sampling
from dreamgym.experience.setup import engine_options, prompt_options


def one(args: argparse.Namespace, tokens: int) -> dict[str, Any]:
    """One setting in this process: engine start, a warm-up batch, then every batch timed."""
    from dreamgym.experience.engine import InProcessClient

    engine = EngineConfig(dtype=args.dtype, max_model_len=2048, omp_threads=1, kv_cache_gib=args.kv_cache_gib,
                          cpu_binds=[args.cpu_bind] if args.cpu_bind else [])
    cfg = ExperienceModelConfig(model=args.model, engine=engine, top_k=2, history_steps=2, demo_state_max_chars=300,
                                history_state_max_chars=200, speculative_tokens=tokens)
    from dreamgym.data.transitions import iter_transitions

    data = list(iter_transitions(args.data))
    store = TransitionIndex(data if args.store is None else iter_transitions(args.store))
    # each query's own episode left out of its demonstrations, as for a step the model has not seen
    queries = [it.query for it in build_items(data[: args.queries], store, prompt_options(cfg), leave_episode_out=True)]
    client = InProcessClient(engine_options(cfg, args.model, 0))
    try:
        opts = prompt_options(cfg)
        prompts = [client.render(build_messages(q, opts)) for q in queries]
        sampling = Sampling(temperature=0.0, max_tokens=args.max_tokens, stop=STOP)
        batches = _batches(prompts, args.concurrency)
        client.complete_ids(batches[0], sampling)  # warm-up (and the prefix cache of the system prompt)
        t0 = time.perf_counter()
        outs = []
        for b in batches:
            outs += client.complete_ids(b, sampling)
        seconds = time.perf_counter() - t0
    finally:
        client.close()
    tally = InvalidAccounting()
    for c in outs:
        tally.add_reply(c)
    tally.model_calls = len(outs)
    return {"speculative_tokens": tokens, "seconds": round(seconds, 2),
            "generated_tokens_per_s": round(tally.completion_tokens / seconds, 1),
            **tally.token_figures(len(outs)), "texts": [c.text for c in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the experience model (HF folder or alias)")
    ap.add_argument("--data", required=True, help="held-out transitions (parquet)")
    ap.add_argument("--store", default=None, help="retrieval store (default: --data, each episode left out)")
    ap.add_argument("--settings", default="0,4", help="comma-separated speculative_tokens values")
    ap.add_argument("--queries", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-cache-gib", type=float, default=0.5)
    ap.add_argument("--cpu-bind", default="1")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args, args.one)))
        return
    results = []
    for tokens in [int(x) for x in args.settings.split(",")]:
        with tempfile.TemporaryFile("w+") as f:
            argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                    if k not in ("one", "out") and v is not None]
            subprocess.run([sys.executable, __file__, *argv, "--one", str(tokens)], stdout=f, check=True)
            f.seek(0)
            results.append(json.loads(f.read().strip().splitlines()[-1]))
    first = results[0]["texts"]
    for r in results:
        texts = r.pop("texts")
        r["replies_differing_from_first"] = sum(a != b for a, b in zip(texts, first, strict=True))
    out = {"bench": "speculative", "model": args.model, "data": args.data, "queries": args.queries,
           "concurrency": args.concurrency, "max_tokens": args.max_tokens, "results": results,
           "speedup_vs_first": [round(results[0]["seconds"] / r["seconds"], 3) for r in results]}
    emit(out, args.out)


if __name__ == "__main__":
    main()
