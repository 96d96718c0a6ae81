"""Benchmark of the replay buffer on real TextWorldExpress data, printed as JSON.

What it measures, at each size N (default 10k and 100k stored transitions):

- storage insert rate with precomputed vectors, per embedded backend (qdrant-edge in-process,
  qdrant-client local mode in memory, and in a folder at the smallest size only: it is ~10x slower),
  both through ``ReplayBuffer.add`` (ids, dedup check, payloads, eviction) and raw ``store.upsert``;
- k=8 query latency p50/p99, one query at a time as a rollout issues them: in-process per backend, and
  through Ray with 1 and S shard actors (``search`` with a vector, and ``retrieve`` by text, which
  includes the embedding in a shard);
- recall@8 of the approximate search (HNSW, built by ``optimize``) against exact search, its build
  time and latency;
- retrieval usefulness: for held-out real transitions (test-split tasks), how often the top-8
  demonstrations contain the same (state, action), the same next state, and how often copying the
  top-1 demonstration's next state / reward is right (the copy baseline of the experience model).

Once (not per size): the end-to-end add rate including the embedding phi(s, a).

Targets for the embedded default (issue 4): insert >= 20,000 points/s, k=8 p50 <= 20 ms at 100k,
recall@8 >= 0.95.

Data: ``twx:coin`` transitions made by ``dreamgym collect``. The default game (3 rooms) has only ~1,100
distinct transitions however many episodes are played (the buffer stores exact duplicates once), so
the bench uses 11 rooms with doors, where 10k episodes give ~140k distinct transitions::

    P="--env.params.numLocations 11 --env.params.includeDoors 1 --env.max_steps 50"
    .venv/bin/dreamgym collect --env twx:coin --policy random --episodes 10000 $P --out coin11.parquet
    .venv/bin/dreamgym collect --env twx:coin --policy random --episodes 300 $P --env.split test \\
        --out coin11_test.parquet
    .venv/bin/python bench/bench_replay.py --data coin11.parquet --heldout coin11_test.parquet

Embedding 100k states costs minutes to an hour on 2 shared cores (a coin state is ~50-160 word
pieces), so vectors are cached in ``--cache`` (resumable; ``--embed-only`` fills it and stops).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import emit, load_average

from dreamgym.config import ReplayConfig
from dreamgym.data.transitions import iter_batches
from dreamgym.replay.buffer import ReplayBuffer
from dreamgym.replay.encoder import Encoder
from dreamgym.replay.records import point_id, point_payload
from dreamgym.replay.seed import acknowledged_adds
from dreamgym.types import Transition

K = 8
_FIELDS = set(Transition.__dataclass_fields__)


def log(msg: str) -> None:
    print(f"[bench_replay {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_unique(paths: list[str], n: int) -> list[Transition]:
    """The first ``n`` distinct transitions (by content id) of the files, in file order."""
    seen: set[str] = set()
    out: list[Transition] = []
    for path in paths:
        for batch in iter_batches(path, 8192):
            for row in batch.to_pylist():
                t = Transition(**{k: v for k, v in row.items() if k in _FIELDS})
                pid = point_id(t)
                if pid not in seen:
                    seen.add(pid)
                    out.append(t)
                    if len(out) >= n:
                        return out
    return out


def cached_vectors(pairs: list[tuple[str, str]], encoder: Encoder, cache: Path, tag: str,
                   chunk: int = 2048) -> np.ndarray:
    """phi(s, a) for ``pairs``, computed chunk by chunk and kept in ``cache`` (resumable)."""
    model = encoder._load()
    key = f"{encoder.name}|{encoder.dtype}|{model.max_seq_length}"
    d = cache / hashlib.sha256(key.encode()).hexdigest()[:12]
    d.mkdir(parents=True, exist_ok=True)
    parts = []
    t0, done = time.perf_counter(), 0
    for i in range(0, len(pairs), chunk):
        part = pairs[i:i + chunk]
        h = hashlib.sha256(json.dumps(part).encode()).hexdigest()[:16]
        f = d / f"{tag}-{i // chunk:05d}-{h}.npy"
        if f.is_file():
            parts.append(np.load(f))
            continue
        v = encoder.encode(part)
        np.save(f, v)
        parts.append(v)
        done += len(part)
        rate = done / (time.perf_counter() - t0)
        left = (len(pairs) - i - len(part)) / rate / 60
        log(f"embedded {tag} {i + len(part)}/{len(pairs)} ({rate:.0f}/s, ~{left:.0f} min left)")
    return np.concatenate(parts) if parts else np.zeros((0, encoder.dim), np.float32)


def pct(lat: list[float]) -> dict[str, float]:
    a = np.asarray(lat) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2),
            "mean_ms": round(float(a.mean()), 2)}


def timed_queries(fn: Any, queries: list[Any]) -> dict[str, float]:
    for q in queries[:2]:  # warm-up
        fn(q)
    lat = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        lat.append(time.perf_counter() - t)
    return {**pct(lat), "queries": len(queries)}


def fill(buf: Any, ts: list[Transition], vecs: np.ndarray, batch: int = 2048) -> float:
    """Seconds to add ``ts`` with their vectors; the sharded buffer gets its writes pipelined as in seeding."""
    t = time.perf_counter()
    batches = ((ts[i:i + batch], vecs[i:i + batch]) for i in range(0, len(ts), batch))
    for _ in acknowledged_adds(buf, batches):
        pass
    return time.perf_counter() - t


def raw_upsert_rate(cfg: ReplayConfig, root: Path, ts: list[Transition], vecs: np.ndarray) -> float:
    """Points/s of ``store.upsert`` alone (payloads built beforehand): the storage engine's own rate."""
    from dreamgym.replay.storage import open_store

    store = open_store(cfg, vecs.shape[1], 0, root)
    ids = [point_id(t) for t in ts]
    payloads = [point_payload(t, -1, -1, i) for i, t in enumerate(ts)]
    t0 = time.perf_counter()
    for i in range(0, len(ts), 2048):
        store.upsert(ids[i:i + 2048], vecs[i:i + 2048], payloads[i:i + 2048])
    dt = time.perf_counter() - t0
    store.close()
    return len(ts) / dt


def recall_at_k(approx: list[list[Any]], exact: list[list[Any]]) -> dict[str, float]:
    """Share of the exact top-k found by the approximate search; ``tie_aware`` also accepts a hit whose
    score equals the k-th exact score (identical (s, a) pairs make such ties common here)."""
    strict, tie = [], []
    for a, e in zip(approx, exact, strict=True):
        ids = {d.id for d in e}
        kth = e[-1].score if e else 1.0
        strict.append(len({d.id for d in a} & ids) / max(len(e), 1))
        tie.append(min(1.0, sum(1 for d in a if d.id in ids or d.score >= kth - 1e-6) / max(len(e), 1)))
    return {"recall_at_8": round(float(np.mean(strict)), 4), "recall_at_8_tie_aware": round(float(np.mean(tie)), 4)}


def usefulness(buf: ReplayBuffer, held: list[Transition], hvecs: np.ndarray, stored: list[Transition]) -> dict:
    sa = {(t.state, t.action) for t in stored}
    nxt = {t.next_state for t in stored}
    res = buf.search(hvecs, k=K, filters={"source": "real"})
    same_sa = same_next = top1_next = top1_reward = 0
    for h, demos in zip(held, res, strict=True):
        same_sa += any(d.transition.state == h.state and d.transition.action == h.action for d in demos)
        same_next += any(d.transition.next_state == h.next_state for d in demos)
        top1_next += bool(demos) and demos[0].transition.next_state == h.next_state
        top1_reward += bool(demos) and demos[0].transition.reward == h.reward
    n = len(held)
    return {
        "heldout_queries": n,
        "topk_contains_same_state_action": round(same_sa / n, 4),
        "topk_contains_same_next_state": round(same_next / n, 4),
        "top1_next_state_exact": round(top1_next / n, 4),
        "top1_reward_equal": round(top1_reward / n, 4),
        "upper_bound_state_action_in_buffer": round(sum((h.state, h.action) in sa for h in held) / n, 4),
        "upper_bound_next_state_in_buffer": round(sum(h.next_state in nxt for h in held) / n, 4),
    }


def bench_size(n: int, ts: list[Transition], vecs: np.ndarray, held: list[Transition], hvecs: np.ndarray,
               encoder: Encoder, tmp: Path, queries: int, local_queries: int, smallest: bool,
               skip_local: bool = False) -> dict[str, Any]:
    ts, vecs = ts[:n], vecs[:n]
    qv = [hvecs[i:i + 1] for i in range(min(queries, len(hvecs)))]
    out: dict[str, Any] = {"stored": n}

    backends = [("edge", "edge", True)] + ([] if skip_local else [("local_memory", "local", False)])
    if smallest and not skip_local:
        backends.append(("local_path", "local", True))
    exact_results = None
    for label, backend, on_disk in backends:
        root = tmp / f"{label}-{n}"
        cfg = ReplayConfig(backend=backend, path=root if on_disk else None)  # type: ignore[arg-type]
        log(f"N={n} {label}: insert")
        buf = ReplayBuffer.from_config(cfg, root if on_disk else None, encoder=encoder)
        dt = fill(buf, ts, vecs)
        assert len(buf) == n, (len(buf), n)
        r: dict[str, Any] = {"add_points_per_s": round(n / dt), "add_seconds": round(dt, 2)}
        log(f"N={n} {label}: queries")
        # qdrant-client's local mode filters payloads in Python (~1 s a query at 10k here): fewer queries.
        lq = qv if backend == "edge" else qv[:local_queries]
        r["query_k8"] = timed_queries(lambda q, b=buf: b.search(q, k=K), lq)
        r["query_k8_filtered"] = timed_queries(
            lambda q, b=buf: b.search(q, k=K, filters={"source": "real", "env": "twx:coin"}), lq)
        if label == "edge":
            exact_results = buf.search(np.concatenate(qv), k=K)
            log(f"N={n}: usefulness")
            out["usefulness"] = usefulness(buf, held, hvecs, ts)
        buf.close()
        raw_root = tmp / f"{label}-raw-{n}"
        r["store_upsert_points_per_s"] = round(raw_upsert_rate(cfg, raw_root if on_disk else None, ts, vecs))
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(raw_root, ignore_errors=True)
        out[label] = r

    log(f"N={n}: HNSW build + recall")
    root = tmp / f"hnsw-{n}"
    hcfg = ReplayConfig(path=root, index="hnsw")
    hbuf = ReplayBuffer.from_config(hcfg, encoder=encoder)
    fill(hbuf, ts, vecs)
    t = time.perf_counter()
    hbuf.optimize()
    build = time.perf_counter() - t
    approx = hbuf.search(np.concatenate(qv), k=K)
    out["edge_hnsw"] = {"build_seconds": round(build, 1), "m": hcfg.hnsw_m, "ef_construct": hcfg.hnsw_ef_construct,
                        "hnsw_ef": hcfg.hnsw_ef, **recall_at_k(approx, exact_results or []),
                        "query_k8": timed_queries(lambda q: hbuf.search(q, k=K), qv)}
    hbuf.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


def bench_ray(n: int, ts: list[Transition], vecs: np.ndarray, held: list[Transition], qv: list[np.ndarray],
              tmp: Path, shards: int) -> dict[str, Any]:
    from actors.replay import ShardedReplayBuffer

    res: dict[str, Any] = {}
    texts = [(h.state, h.action) for h in held[:len(qv)]]
    for s in sorted({1, shards}):
        root = tmp / f"ray-{s}-{n}"
        cfg = ReplayConfig(path=root, shards=s, num_cpus=0)
        log(f"N={n} ray S={s}: insert")
        buf = ShardedReplayBuffer.create(cfg)
        dt = fill(buf, ts, vecs)
        r: dict[str, Any] = {"add_points_per_s": round(n / dt)}
        log(f"N={n} ray S={s}: queries")
        r["search_k8"] = timed_queries(lambda q, b=buf: b.search(q, k=K), qv)
        r["retrieve_k8_with_embedding"] = timed_queries(lambda q, b=buf: b.retrieve(q[0], q[1], k=K), texts)
        buf.close()
        shutil.rmtree(root, ignore_errors=True)
        res[f"shards_{s}"] = r
    return res


def e2e_add_rate(ts: list[Transition], tmp: Path, count: int) -> dict[str, Any]:
    """Transitions/s of ``add`` without vectors: embedding with the default encoder plus storage."""
    cfg = ReplayConfig(path=tmp / "e2e")
    enc = Encoder(cfg.encoder, cfg.encode_batch_size, dtype=cfg.encoder_dtype, cache_size=0)
    enc.encode([("warm", "up")])
    buf = ReplayBuffer.from_config(cfg, encoder=enc)
    t = time.perf_counter()
    for i in range(0, count, 256):
        buf.add(ts[i:i + 256])
    dt = time.perf_counter() - t
    out = {"transitions": count, "transitions_per_s": round(count / dt, 1), "encoder_dtype": enc.dtype,
           "torch_threads": __import__("torch").get_num_threads()}
    buf.close()
    return out


def start_ray(attempts: int = 3) -> None:
    """A fresh local Ray (2 CPUs); retried because a loaded machine can time out the raylet start."""
    import ray

    for i in range(attempts):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            return
        except Exception as e:
            log(f"ray.init failed ({e}); retrying")
            ray.shutdown()
            time.sleep(10 * (i + 1))
    raise RuntimeError("could not start a local Ray")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", required=True, help="transitions Parquet file(s) (train split)")
    ap.add_argument("--heldout", required=True, help="transitions Parquet file of held-out tasks (test split)")
    ap.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    ap.add_argument("--shards", type=int, default=2, help="S for the sharded latency (also measured at 1)")
    ap.add_argument("--queries", type=int, default=300, help="held-out queries for latency and usefulness")
    ap.add_argument("--skip-local", action="store_true", help="measure the edge backend only")
    ap.add_argument("--local-queries", type=int, default=20, help="queries for qdrant-client local mode (slow)")
    ap.add_argument("--e2e", type=int, default=1024, help="transitions embedded for the end-to-end add rate")
    ap.add_argument("--cache", default="/tmp/dreamgym-bench-replay-cache", help="vector cache folder")
    ap.add_argument("--embed-only", action="store_true", help="fill the vector cache and stop")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()

    load0 = os.getloadavg()
    encoder = Encoder()
    n_max = max(args.sizes)
    log(f"reading {n_max + args.e2e} distinct transitions from {args.data}")
    ts = load_unique(args.data, n_max + args.e2e)
    if len(ts) < n_max + args.e2e:
        sys.exit(f"only {len(ts)} distinct transitions in {args.data}; need {n_max + args.e2e} (collect more)")
    extra, ts = ts[n_max:], ts[:n_max]
    rng = random.Random(0)
    held_all = [Transition(**{k: v for k, v in r.items() if k in _FIELDS})
                for b in iter_batches(args.heldout, 8192) for r in b.to_pylist()]
    held = rng.sample(held_all, min(args.queries, len(held_all)))
    cache = Path(args.cache)
    hvecs = cached_vectors([(h.state, h.action) for h in held], encoder, cache, "heldout")
    vecs = cached_vectors([(t.state, t.action) for t in ts], encoder, cache, "train")
    if args.embed_only:
        log("vector cache complete")
        return

    result: dict[str, Any] = {
        "data": args.data, "heldout": args.heldout, "env": "twx:coin", "k": K, "shards": args.shards,
        "dim": int(vecs.shape[1]), "encoder": encoder.name, "encoder_dtype": encoder.dtype,
        "cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load0],
    }
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmpd:
        tmp = Path(tmpd)
        for i, n in enumerate(sorted(args.sizes)):
            result[f"n_{n}"] = bench_size(n, ts, vecs, held, hvecs, encoder, tmp, args.queries, args.local_queries,
                                          smallest=i == 0, skip_local=args.skip_local)
        log("end-to-end add with embedding")
        result["e2e_add_with_embedding"] = e2e_add_rate(extra, tmp, args.e2e)
        start_ray()
        qv = [hvecs[i:i + 1] for i in range(min(args.queries, len(hvecs)))]
        for n in sorted(args.sizes):
            result[f"n_{n}"]["ray"] = bench_ray(n, ts[:n], vecs[:n], held, qv, tmp, args.shards)
    result["loadavg_at_end"] = load_average()
    import ray

    ray.shutdown()
    emit(result, args.out, indent=2)


if __name__ == "__main__":
    main()
