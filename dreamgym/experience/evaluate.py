"""Evaluating an experience model on held-out real transitions, beside the retrieval-only copy baseline.

For each held-out transition ``(s_t, a_t) -> (s_{t+1}, r, done, success)`` the query carries the task,
the episode's earlier steps (from the same file) and the top-k demonstrations retrieved from the
store (the training data). Metrics, over all transitions and over the *unseen* ones (whose exact
``(s_t, a_t)`` pair is not in the store, where copying cannot be right by construction):

- ``reward_acc``: ``|r_pred - r| <= 1e-3``; ``done_acc`` / ``success_acc``: exact booleans;
- ``exact``: next state equal after whitespace normalisation; ``token_f1``: bag-of-words F1 of the
  next state (lower-cased words);
- ``invalid_rate``: predictions with no parseable reply (they count as wrong in every metric);
- ``reward_rate`` beside ``true_reward_rate``: the share of transitions predicted to pay a reward, and the
  share that did (a model that pays too often teaches the policy that success is easy);
- ``transitions_per_s``: predictions per wall-clock second of the predict calls.

The copy baseline predicts the top-1 demonstration's next state, reward, done and success.

Labels: a ``done`` caused only by the collection's step budget (the last allowed step, no success) is
not an environment event the model can see, so with ``step_budget`` set such labels count as not done
(the ``SyntheticEnv`` applies its own budget).
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreamgym.experience.prompts import PromptOptions
from dreamgym.experience.retrieval import TransitionIndex
from dreamgym.experience.schema import ExperienceQuery, HistoryStep, Prediction
from dreamgym.types import Transition

_WORD = re.compile(r"[a-z0-9]+")


def normalise(text: str) -> str:
    return " ".join(text.split())


def token_f1(pred: str, truth: str) -> float:
    p, t = Counter(_WORD.findall(pred.lower())), Counter(_WORD.findall(truth.lower()))
    if not p and not t:
        return 1.0
    common = sum((p & t).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(t.values())
    return 2 * precision * recall / (precision + recall)


def done_label(t: Transition, step_budget: int | None) -> bool:
    """``t.done``, except a step-budget truncation (last allowed step, no success) counts as not done."""
    if step_budget is not None and t.done and not t.success and t.reward == 0 and t.step + 1 >= step_budget:
        return False
    return t.done


@dataclass
class EvalItem:
    transition: Transition
    query: ExperienceQuery
    seen: bool
    """Whether the store holds this exact ``(s_t, a_t)`` pair."""


def build_items(
    transitions: Sequence[Transition], index: TransitionIndex, opts: PromptOptions,
    leave_episode_out: bool = False,
) -> list[EvalItem]:
    """Queries for every transition: history from the same episode, top-k demonstrations from ``index``
    (leaving out transitions seen only in the same episode when ``leave_episode_out``)."""
    episodes: dict[str, list[Transition]] = defaultdict(list)
    for t in transitions:
        episodes[t.episode_id].append(t)
    pair_episodes: dict[tuple[str, str], set[str]] = defaultdict(set)
    for e in index.entries:
        pair_episodes[(e.t.state, e.t.action)] |= e.episodes
    items = []
    for eid, steps in episodes.items():
        steps.sort(key=lambda t: t.step)
        history: list[HistoryStep] = []
        for t in steps:
            exclude = eid if leave_episode_out else None
            demos = index.search(t.state, t.action, max(opts.top_k, 1), exclude_episode=exclude)
            q = ExperienceQuery(env=t.env, instruction=t.instruction, state=t.state, action=t.action,
                                history=list(history), demonstrations=demos,
                                admissible_actions=t.admissible_actions)
            stored = pair_episodes.get((t.state, t.action), set())
            items.append(EvalItem(t, q, bool(stored - {eid}) if leave_episode_out else bool(stored)))
            history.append(HistoryStep(action=t.action, state=t.next_state))
    return items


def copy_baseline(items: Sequence[EvalItem]) -> list[Prediction]:
    """The retrieval-only baseline: the top-1 demonstration's outcome."""
    out = []
    for it in items:
        if not it.query.demonstrations:
            out.append(Prediction("", 0.0, False, False, valid=False, invalid_reason="no-demonstration"))
            continue
        d = it.query.demonstrations[0]
        out.append(Prediction(d.next_state, d.reward, d.done, d.success, reasoning="copied top-1", attempts=0))
    return out


def score(
    items: Sequence[EvalItem], preds: Sequence[Prediction], step_budget: int | None, seconds: float
) -> dict[str, Any]:
    """Metrics (module docstring) over all items and over the unseen ones."""
    def block(pairs: list[tuple[EvalItem, Prediction]]) -> dict[str, Any]:
        n = len(pairs)
        if n == 0:
            return {"n": 0}
        acc: dict[str, float] = defaultdict(float)
        for it, p in pairs:
            t = it.transition
            if not p.valid:
                acc["invalid"] += 1
                continue
            acc["paid"] += p.reward > 0
            acc["reward"] += abs(p.reward - t.reward) <= 1e-3
            acc["done"] += p.done == done_label(t, step_budget)
            acc["success"] += p.success == (t.success and t.done)
            acc["exact"] += normalise(p.next_state) == normalise(t.next_state)
            acc["f1"] += token_f1(p.next_state, t.next_state)
        return {"n": n, "reward_acc": round(acc["reward"] / n, 4), "done_acc": round(acc["done"] / n, 4),
                "success_acc": round(acc["success"] / n, 4), "exact": round(acc["exact"] / n, 4),
                "token_f1": round(acc["f1"] / n, 4), "invalid_rate": round(acc["invalid"] / n, 4),
                "reward_rate": round(acc["paid"] / n, 4),
                "true_reward_rate": round(sum(it.transition.reward > 0 for it, _ in pairs) / n, 4)}

    pairs = list(zip(items, preds, strict=True))
    result = block(pairs)
    result["unseen"] = block([(it, p) for it, p in pairs if not it.seen])
    result["transitions_per_s"] = round(len(pairs) / seconds, 2) if seconds > 0 else None
    result["seconds"] = round(seconds, 3)
    return result


def evaluate(
    heldout: str | Path, store: str | Path | None, opts: PromptOptions,
    predict: Callable[[list[ExperienceQuery]], list[Prediction]] | None = None,
    limit: int | None = None, step_budget: int | None = 20, seed: int = 0, batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``predict`` (e.g. ``ExperienceModel.predict``) and the copy baseline on ``heldout``.

    ``store``: the transitions the demonstrations come from (the training data). ``None``: the held-out
    file itself, leaving each query's own episode out. ``limit``: a seeded sample of that many transitions.
    """
    from dreamgym.data.transitions import iter_transitions

    rows = list(iter_transitions(heldout))
    index = TransitionIndex.from_parquet(store) if store is not None else TransitionIndex(rows)
    items = build_items(rows, index, opts, leave_episode_out=store is None)
    if limit is not None and limit < len(items):
        items = random.Random(seed).sample(items, limit)
    t0 = time.perf_counter()
    base = copy_baseline(items)
    result: dict[str, Any] = {
        "data": {"heldout": str(heldout), "heldout_transitions": len(rows), "evaluated": len(items),
                 "unseen": sum(not it.seen for it in items),
                 "store": str(store) if store else "heldout (leave-episode-out)",
                 "store_transitions": index.size, "store_distinct": len(index.entries), "top_k": opts.top_k,
                 "history_steps": opts.history_steps},
        "copy_baseline": score(items, base, step_budget, time.perf_counter() - t0),
    }
    if predict is not None:
        preds: list[Prediction] = []
        t0 = time.perf_counter()
        for i in range(0, len(items), batch_size):
            chunk = [it.query for it in items[i: i + batch_size]]
            preds += predict(chunk)
            if progress:
                progress(len(chunk))
        result["model"] = score(items, preds, step_budget, time.perf_counter() - t0)
        result["examples"] = [
            {"state": it.query.state[:160], "action": it.query.action, "truth": it.transition.next_state[:160],
             "pred": p.next_state[:160], "valid": p.valid, "reason": p.invalid_reason, "raw": p.raw[:300]}
            for it, p in list(zip(items, preds, strict=True))[:3]
        ]
    return result


_COLS = (("reward_acc", "reward acc"), ("done_acc", "done acc"), ("success_acc", "success acc"),
         ("exact", "next-state exact"), ("token_f1", "next-state F1"), ("invalid_rate", "invalid rate"))


def format_table(result: dict[str, Any], names: Sequence[str] = ("copy_baseline", "model")) -> str:
    """A one-screen table: one column per system, all transitions then unseen ones."""
    systems = [n for n in names if n in result]
    width = 18
    head = f"{'metric':<24}" + "".join(f"{n:>{width}}" for n in systems)
    lines = [head, "-" * len(head)]
    for subset, label in ((None, "all"), ("unseen", "unseen (s,a)")):
        n_str = "".join(f"{(result[s][subset] if subset else result[s]).get('n', 0):>{width}}" for s in systems)
        lines.append(f"{label + ' n':<24}{n_str}")
        for key, name in _COLS:
            vals = []
            for s in systems:
                m = result[s][subset] if subset else result[s]
                v = m.get(key)
                vals.append(f"{v:>{width}.3f}" if isinstance(v, float | int) else f"{'-':>{width}}")
            lines.append(f"  {name:<22}" + "".join(vals))
    tps = "".join(f"{result[s].get('transitions_per_s') or 0:>{width}.1f}" for s in systems)
    lines.append(f"{'transitions/s':<24}{tps}")
    return "\n".join(lines)
