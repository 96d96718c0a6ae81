"""The expert (gold) episodes of offline real data, and how the data splits into expert and other transitions.

``dreamgym collect`` marks each transition with the policy that chose it (``policy``: ``gold``, ``random``,
``mixed:gold``, ``mixed:random``). Expert episodes are the successful, complete episodes whose every step the gold
policy chose: behaviour cloning (the warm start, the study's ``bc`` arm) clones them, and a study counts them
apart from the other offline transitions every synthetic arm learns from.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from dreamgym.types import Transition

#: ``Transition.policy`` of the gold (expert) policy, played alone or as a share of ``mixed``.
GOLD_POLICIES = ("gold", "mixed:gold")


def gold_episodes(transitions: Iterable[Transition], limit: int | None = None) -> list[list[Transition]]:
    """Successful episodes whose every step came from the gold policy, in first-seen order."""
    episodes: dict[str, list[Transition]] = defaultdict(list)
    for t in transitions:
        if t.policy in GOLD_POLICIES and t.source == "real":
            episodes[t.episode_id].append(t)
    out = []
    for steps in episodes.values():
        steps.sort(key=lambda t: t.step)
        if steps and steps[-1].success and [t.step for t in steps] == list(range(len(steps))):
            out.append(steps)
        if limit is not None and len(out) >= limit:
            break
    return out


def offline_split(path: str | Path, env: str | None = None, gold_limit: int | None = None) -> dict[str, int]:
    """Real transitions of an offline file (of ``env`` when given): ``total``, ``expert`` (in the gold episodes
    ``gold_episodes`` finds, at most ``gold_limit`` of them), ``other`` (the rest) and ``expert_episodes``."""
    from dreamgym.data.transitions import iter_transitions

    rows = [t for t in iter_transitions(path) if t.source == "real" and (env is None or t.env == env)]
    gold = gold_episodes(rows, limit=gold_limit)
    expert = sum(len(e) for e in gold)
    return {"total": len(rows), "expert": expert, "other": len(rows) - expert, "expert_episodes": len(gold)}
