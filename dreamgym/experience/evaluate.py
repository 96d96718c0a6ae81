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

The copy baseline predicts the top-1 demonstration's next state, reward, done and success. With
``fidelity`` the model's first replies and the rules alone are scored too, on seen and unseen ``(s, a)``
(``dreamgym.experience.fidelity``).

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

from dreamgym.experience.fidelity import fidelity_predictions
from dreamgym.experience.model import ExperienceModel
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
        earned = 0.0
        for t in steps:
            exclude = eid if leave_episode_out else None
            demos = index.search(t.state, t.action, max(opts.top_k, 1), exclude_episode=exclude)
            q = ExperienceQuery(env=t.env, instruction=t.instruction, state=t.state, action=t.action,
                                history=list(history), demonstrations=demos,
                                admissible_actions=t.admissible_actions, reward_so_far=earned)
            stored = pair_episodes.get((t.state, t.action), set())
            items.append(EvalItem(t, q, bool(stored - {eid}) if leave_episode_out else bool(stored)))
            history.append(HistoryStep(action=t.action, state=t.next_state))
            earned += t.reward
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


def metrics(pairs: Sequence[tuple[EvalItem, Prediction]], step_budget: int | None) -> dict[str, Any]:
    """The metrics of the module docstring over ``(item, prediction)`` pairs (``{"n": 0}`` for none)."""
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


def score(
    items: Sequence[EvalItem], preds: Sequence[Prediction], step_budget: int | None, seconds: float
) -> dict[str, Any]:
    """Metrics (module docstring) over all items and over the unseen ones."""
    pairs = list(zip(items, preds, strict=True))
    result = metrics(pairs, step_budget)
    result["unseen"] = metrics([(it, p) for it, p in pairs if not it.seen], step_budget)
    result["transitions_per_s"] = round(len(pairs) / seconds, 2) if seconds > 0 else None
    result["seconds"] = round(seconds, 3)
    return result


def evaluate(
    heldout: str | Path, store: str | Path | None, opts: PromptOptions,
    predict: Callable[[list[ExperienceQuery]], list[Prediction]] | None = None,
    limit: int | None = None, step_budget: int | None = 20, seed: int = 0, batch_size: int = 64,
    progress: Callable[[int], None] | None = None, fidelity: bool = False,
) -> dict[str, Any]:
    """Evaluate ``predict`` (e.g. ``ExperienceModel.predict``) and the copy baseline on ``heldout``.

    ``store``: the transitions the demonstrations come from (the training data). ``None``: the held-out
    file itself, leaving each query's own episode out. ``limit``: a seeded sample of that many transitions.
    ``fidelity``: also score the model's first replies, the rules alone and copy-top-1 beside the model after
    the rules, on seen and unseen ``(s, a)`` (``fidelity_scores``); ``predict`` must then send every query to
    the model (``ExperienceModel(inadmissible='model')``), and ``model`` is the outcome after the rules.
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
        seconds = time.perf_counter() - t0
        if fidelity:
            systems = fidelity_predictions([it.query for it in items], preds, base)
            result["model"] = score(items, systems["model_after_rules"], step_budget, seconds)
            result["fidelity"] = fidelity_scores(items, systems, step_budget)
        else:
            result["model"] = score(items, preds, step_budget, seconds)
        result["examples"] = [
            {"state": it.query.state[:160], "action": it.query.action, "truth": it.transition.next_state[:160],
             "pred": p.next_state[:160], "valid": p.valid, "reason": p.invalid_reason, "raw": p.raw[:300]}
            for it, p in list(zip(items, preds, strict=True))[:3]
        ]
    return result


#: Names of the fidelity metrics (the world-model literature's) for ``metrics``' keys.
FIDELITY_METRICS = (("next_state_exact", "exact"), ("next_state_f1", "token_f1"), ("reward_acc", "reward_acc"),
                    ("done_acc", "done_acc"), ("success_acc", "success_acc"), ("invalid_rate", "invalid_rate"))


def fidelity_scores(items: Sequence[EvalItem], systems: dict[str, list[Prediction]],
                    step_budget: int | None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{subset: {system: {next_state_exact, next_state_f1, reward_acc, done_acc, success_acc, invalid_rate, n}}}``
    for the subsets ``unseen`` and ``seen`` ``(s, a)`` and ``all``; where some actions are outside their state's
    admissible list, also ``ruled_out`` (the rules settle them) and ``admissible`` (the rest)."""
    subsets = {"unseen": [not it.seen for it in items], "seen": [it.seen for it in items], "all": [True] * len(items)}
    ruled = [ExperienceModel.ruled_out(it.query) for it in items]
    if any(ruled):
        subsets.update(ruled_out=ruled, admissible=[not r for r in ruled])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for subset, keep in subsets.items():
        out[subset] = {}
        for name, preds in systems.items():
            m = metrics([(it, p) for it, p, k in zip(items, preds, keep, strict=True) if k], step_budget)
            out[subset][name] = {"n": m["n"], **{new: m[old] for new, old in FIDELITY_METRICS if old in m}}
    return out


def format_fidelity(scores: dict[str, dict[str, dict[str, Any]]]) -> str:
    """One line per subset and system: n, next-state exact and F1, reward, done, invalid."""
    head = f"{'subset':<8}{'system':<20}{'n':>5}{'exact':>8}{'F1':>8}{'reward':>8}{'done':>8}{'invalid':>9}"
    lines = [head, "-" * len(head)]
    for subset, systems in scores.items():
        for name, m in systems.items():
            if not m["n"]:
                lines.append(f"{subset:<8}{name:<20}{0:>5}")
                continue
            lines.append(f"{subset:<8}{name:<20}{m['n']:>5}{m['next_state_exact']:>8.3f}{m['next_state_f1']:>8.3f}"
                         f"{m['reward_acc']:>8.3f}{m['done_acc']:>8.3f}{m['invalid_rate']:>9.3f}")
    return "\n".join(lines)


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
