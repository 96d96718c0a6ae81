"""Benchmark: log-probs of the reply tokens with the LM head on every position vs on the needed columns only.

``learner.model.token_logprobs`` takes ``needed`` (the loss mask) and runs the LM head and the softmax only on
the columns some row needs. This times one forward + backward of ``token_logprobs`` both ways, alternating
(so a shared machine's load falls on both alike), on the batch shapes the loop trains on:

- ``policy``: GRPO micro-batches of windowed agent turns: a long prompt (``--prompt`` tokens: system text,
  worked example, admissible list) and a short reply (``--reply``: one action);
- ``experience``: the experience-model SFT's examples, one at a time: a prompt with the top-k demonstrations
  and a reply of reasoning plus next state (``--em-prompt``, ``--em-reply``).

Both ways must give the same log-probs on the needed entries (checked; the largest difference is printed).

    .venv/bin/python bench/bench_logits.py [--model smollm2-135m] [--repeats 5] [--out bench/results/logits.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import emit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def batch(rows: int, prompt: int, reply: int, vocab: int, seed: int) -> tuple[Any, Any, Any]:
    """Right-padded rows whose prompts differ by up to 10%, and the mask of their reply targets."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = [prompt - int(prompt * 0.1 * r / max(rows - 1, 1)) for r in range(rows)]
    t = max(lens) + reply
    ids = torch.randint(3, vocab, (rows, t), generator=g)
    att = torch.zeros(rows, t, dtype=torch.long)
    needed = torch.zeros(rows, t - 1, dtype=torch.bool)
    for r, p in enumerate(lens):
        att[r, : p + reply] = 1
        needed[r, p - 1: p - 1 + reply] = True  # column j is token j+1: the reply's tokens p..p+reply-1
    return ids, att, needed


def timed(model: Any, ids: Any, att: Any, needed: Any | None) -> tuple[float, Any]:
    from learner.model import token_logprobs

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logp = token_logprobs(model, ids, att, 1.0, needed)
    mask = needed if needed is not None else torch_ones(logp)
    (logp * mask).sum().backward()
    return time.perf_counter() - t0, logp.detach()


def torch_ones(x: Any) -> Any:
    import torch

    return torch.ones_like(x, dtype=torch.bool)


def compare(model: Any, name: str, rows: int, prompt: int, reply: int, repeats: int) -> dict[str, Any]:
    vocab = model.config.vocab_size
    ids, att, needed = batch(rows, prompt, reply, vocab, 0)
    timed(model, ids, att, needed)  # warm-up
    every, only, diff = [], [], 0.0
    for _ in range(repeats):
        s_all, lp_all = timed(model, ids, att, None)
        s_needed, lp_needed = timed(model, ids, att, needed)
        every.append(s_all)
        only.append(s_needed)
        diff = max(diff, float((lp_all[needed] - lp_needed[needed]).abs().max()))
    a, b = statistics.median(every), statistics.median(only)
    print(f"[bench_logits] {name}: every position {a:.2f} s, needed columns {b:.2f} s ({a / b:.2f}x)",
          file=sys.stderr, flush=True)
    return {"rows": rows, "prompt_tokens": prompt, "reply_tokens": reply, "tokens": int(att.sum()),
            "every_position_s": round(a, 3), "needed_columns_s": round(b, 3), "speedup": round(a / b, 3),
            "max_logprob_difference": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias of dreamgym.models or an HF folder")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", type=int, default=4, help="policy micro-batch rows")
    ap.add_argument("--prompt", type=int, default=600)
    ap.add_argument("--reply", type=int, default=8)
    ap.add_argument("--em-prompt", type=int, default=800)
    ap.add_argument("--em-reply", type=int, default=160)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()

    import torch

    from dreamgym.models import resolve_model
    from learner.model import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm(resolve_model(args.model))
    out = {
        "model": args.model, "precision": "fp32", "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average_start": os.getloadavg(),
        "policy": compare(model, "policy", args.rows, args.prompt, args.reply, args.repeats),
        "experience": compare(model, "experience", 1, args.em_prompt, args.em_reply, args.repeats),
        "load_average_end": os.getloadavg(),
    }
    emit(out, args.out)


if __name__ == "__main__":
    main()
