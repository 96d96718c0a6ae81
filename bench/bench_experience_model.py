"""Benchmark: synthetic transitions/s through the experience-model replicas vs the raw vLLM engine.

The same prompts (real ``twx:coin`` held-out transitions with their top-k demonstrations and history,
built by the experience model's own prompt builder) go through:

- ``raw_engine``: one in-process async vLLM engine, token ids in, text out (no prompt building,
  parsing, retries, Ray or routing);
- ``replicas_1`` / ``replicas_2``: ``ExperienceModel.predict`` (prompt building, strict parsing,
  accounting) through ``RayExperienceClient`` and the least-loaded router over 1 and 2
  ``ExperienceModelReplica`` actors;
- ``http_raw`` / ``http``: the same through a ``python -m vllm.entrypoints.openai.api_server`` process
  (direct chat requests, then ``ExperienceModel`` over ``OpenAIClient``).

Every path sends the same requests in batches of ``--concurrency`` with the same sampling (greedy,
``--max-tokens``, the reply's stop string) and ``max_attempts=1`` (retries would add work the raw
engine does not do; the invalid rate is reported instead). Each path is warmed up with one batch
before timing (the HTTP server's prefix cache is emptied between its two passes, so neither runs on
the other's cache). Engines run one at a time (two for ``replicas_2``). Output: one JSON object.

    .venv/bin/python bench/bench_experience_model.py --model smollm2-135m --out bench/experience_model.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import emit

from dreamgym.config import EngineConfig, ExperienceModelConfig
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.engine import engine_env
from dreamgym.experience.evaluate import build_items
from dreamgym.experience.prompts import STOP, build_messages
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.schema import Completion, CompletionRequest, ExperienceQuery, Sampling
from dreamgym.experience.setup import build_model, engine_options, prompt_options


def _data(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    if args.data and args.store:
        return Path(args.data), Path(args.store)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from experience_data import collect_coin

    return collect_coin(tmp / "train.parquet", "train", 60), collect_coin(tmp / "test.parquet", "test", 30)


def _queries(heldout: Path, store: Path, cfg: ExperienceModelConfig, n: int) -> list[ExperienceQuery]:
    from dreamgym.data.transitions import iter_transitions

    items = build_items(list(iter_transitions(heldout)), TransitionIndex.from_parquet(store), prompt_options(cfg))
    qs = [it.query for it in items]
    return (qs * (n // max(len(qs), 1) + 1))[:n]


def _batches(xs: list[Any], size: int) -> list[list[Any]]:
    return [xs[i: i + size] for i in range(0, len(xs), size)]


def _timed(fn: Any, batches: list[list[Any]]) -> tuple[float, list[Any]]:
    fn(batches[0])  # warm-up
    t0 = time.perf_counter()
    out: list[Any] = []
    for b in batches:
        out += fn(b)
    return time.perf_counter() - t0, out


def _report(seconds: float, n: int, completions: list[Completion] | None = None, model: Any = None) -> dict[str, Any]:
    r: dict[str, Any] = {"transitions": n, "seconds": round(seconds, 3), "transitions_per_s": round(n / seconds, 3)}
    if completions is not None:
        toks = sum(c.completion_tokens for c in completions)
        r.update(completion_tokens=toks, tokens_per_s=round(toks / seconds, 1))
    if model is not None:
        st = model.stats.as_dict()
        r.update(invalid_rate=round(st["invalid"] / max(st["queries"], 1), 4),
                 tokens_per_s=round(st["completion_tokens"] / max(model.busy_s, 1e-9), 1))
    return r


def bench_raw(cfg: ExperienceModelConfig, path: str, queries: list[ExperienceQuery], sampling: Sampling,
              conc: int) -> dict[str, Any]:
    from dreamgym.experience.engine import InProcessClient

    t0 = time.perf_counter()
    client = InProcessClient(engine_options(cfg, path, 0))
    start = time.perf_counter() - t0
    opts = prompt_options(cfg)
    prompts = [client.render(build_messages(q, opts)) for q in queries]  # rendering is not timed: raw = engine only
    try:
        secs, outs = _timed(lambda b: client.complete_ids(b, sampling), _batches(prompts, conc))
    finally:
        client.close()
    return {**_report(secs, len(queries), outs), "start_s": round(start, 1)}


def bench_model(client: ExperienceClient, cfg: ExperienceModelConfig, queries: list[ExperienceQuery],
                conc: int) -> dict[str, Any]:
    batches = _batches(queries, conc)
    build_model(cfg, client).predict(batches[0])  # warm-up, not counted
    model = build_model(cfg, client)
    t0 = time.perf_counter()
    for b in batches:
        model.predict(b)
    return _report(time.perf_counter() - t0, len(queries), model=model)


def bench_replicas(cfg: ExperienceModelConfig, path: str, queries: list[ExperienceQuery], conc: int,
                   n: int) -> dict[str, Any]:
    from actors.experience_model import RayExperienceClient, start_replicas

    engine = cfg.engine.model_copy(update={"omp_threads": max(1, cfg.engine.omp_threads // n)})
    c = cfg.model_copy(update={"replicas": n, "engine": engine})
    t0 = time.perf_counter()
    client = RayExperienceClient(start_replicas(c, path), refresh_s=c.router_refresh_s, owns=True)
    start = time.perf_counter() - t0
    try:
        r = bench_model(client, c, queries, conc)
        r["routed"] = client.router.stats()["sent"]
    finally:
        client.close()
        time.sleep(2)
    return {**r, "start_s": round(start, 1), "omp_threads_per_replica": c.engine.omp_threads}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reset_prefix_cache(base: str) -> bool:
    """Empty the server's prefix cache (dev endpoint), so each timed pass starts as cold as the others."""
    try:
        req = urllib.request.Request(f"{base}/reset_prefix_cache", method="POST")
        return bool(json.loads(urllib.request.urlopen(req, timeout=30).read()).get("success"))
    except (OSError, ValueError):
        return False


def bench_http(cfg: ExperienceModelConfig, path: str, queries: list[ExperienceQuery], sampling: Sampling,
               conc: int, log_dir: Path) -> dict[str, Any]:
    from dreamgym.experience.http_client import OpenAIClient

    port = _free_port()
    env = {**os.environ, **engine_env(engine_options(cfg, path, 0)),
           "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(cfg.engine.kv_cache_gib))),
           "VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache (loopback-only server)
    log = (log_dir / "vllm_server.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--served-model-name", "em",
         "--host", "127.0.0.1", "--port", str(port), "--dtype", cfg.engine.dtype,
         "--max-model-len", str(cfg.engine.max_model_len),
         "--enforce-eager", "--seed", "0", "--enable-prefix-caching", "--disable-log-stats"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited {proc.returncode}; see {log_dir / 'vllm_server.log'}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        start = time.perf_counter() - t0
        client = OpenAIClient(url, concurrency=conc)
        opts = prompt_options(cfg)
        reqs = [CompletionRequest(build_messages(q, opts), sampling) for q in queries]
        secs, outs = _timed(client.complete, _batches(reqs, conc))
        raw = {**_report(secs, len(queries), outs), "start_s": round(start, 1)}
        # The raw pass left every prompt in the prefix cache: without a reset the second pass is measured warm.
        reset = _reset_prefix_cache(f"http://127.0.0.1:{port}")
        ours = {**bench_model(client, cfg, queries, conc), "prefix_cache_reset": reset}
        client.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server process group this function started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    return {"http_raw": raw, "http": ours}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias or HF folder (default smollm2-135m)")
    ap.add_argument("--data", help="held-out transitions (default: collect twx:coin test episodes)")
    ap.add_argument("--store", help="retrieval store (default: collect twx:coin train episodes)")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--omp-threads", type=int, default=2,
                    help="threads of a single engine; each of 2 replicas gets half (at least 1)")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--history-steps", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], choices=["raw", "replicas_1", "replicas_2", "http"])
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()

    import ray

    from dreamgym.models import resolve_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-em-"))
    path = str(resolve_model(args.model))
    engine = EngineConfig(dtype=args.dtype, max_model_len=2048, num_cpus=1, omp_threads=args.omp_threads)
    cfg = ExperienceModelConfig(model=path, engine=engine, top_k=args.top_k, history_steps=args.history_steps,
                                max_tokens=args.max_tokens, max_attempts=1, router_refresh_s=0.5)
    heldout, store = _data(args, tmp)
    queries = _queries(heldout, store, cfg, args.queries)
    sampling = Sampling(temperature=0.0, max_tokens=args.max_tokens, stop=STOP)
    result: dict[str, Any] = {"model": args.model, "dtype": args.dtype, "omp_threads": args.omp_threads,
                              "cpu_bind": "nobind", "queries": len(queries),
                              "concurrency": args.concurrency, "max_tokens": args.max_tokens, "top_k": args.top_k,
                              "history_steps": args.history_steps, "cpus": os.cpu_count()}
    if "raw" not in args.skip:
        result["raw_engine"] = bench_raw(cfg, path, queries, sampling, args.concurrency)
    if not {"replicas_1", "replicas_2"} <= set(args.skip):
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        for n in (1, 2):
            if f"replicas_{n}" not in args.skip:
                result[f"replicas_{n}"] = bench_replicas(cfg, path, queries, args.concurrency, n)
        ray.shutdown()
    if "http" not in args.skip:
        result.update(bench_http(cfg, path, queries, sampling, args.concurrency, tmp))
    raw = result.get("raw_engine", {}).get("transitions_per_s")
    if raw:
        for k in ("replicas_1", "replicas_2", "http_raw", "http"):
            if k in result:
                result[k]["vs_raw"] = round(result[k]["transitions_per_s"] / raw, 3)
    emit(result, args.out)


if __name__ == "__main__":
    main()
