"""Per-episode records of every held-out evaluation: ``<run>/eval_episodes.jsonl``, one JSON object per episode.

A success rate over 64 episodes hides which episodes an arm won; two arms evaluated on the same held-out
tasks can only be compared *paired* (task by task, seed by seed: ``dreamgym.study.paired``) when every episode's
outcome is kept. Each record says which evaluation it belongs to (``label``, ``iteration``, the policy's
``weight_version``, an ``eval_uid`` unique to that evaluation), which episode it is and how it was sampled
(``task_id``, the task's ``task_seed``, ``episode`` = its repetition index within the task, the run's
``run_seed`` and the ``sampling_seed`` of the policy engines), and its outcome (``success``, ``reward``,
``steps``, ``unparsable`` replies and ``invalid_actions``, actions outside the known admissible list).

The pairing key across arms is ``(run_seed, task_id, episode)``: a study gives every arm the same held-out tasks
(``train.eval``) and, for training seed ``k``, the same run seed and engine sampling seed ``k``
(``dreamgym.study.arms.arm_seed_config``). vLLM's CPU sampler has no per-request seed (it crashes), so the
sampling seed is engine-wide: two arms draw from the same seeded stream, not the same per-episode draws.
``policy`` is ``policy`` for the evaluated policy and ``random`` for the random-valid-action baseline.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dreamgym.types import Task, Trajectory

#: The file in the run directory.
EVAL_EPISODES = "eval_episodes.jsonl"


def episode_records(trajectories: Sequence[Trajectory], tasks: Sequence[Task], *, label: str, iteration: int,
                    policy: str, run_seed: int, sampling_seed: int) -> list[dict[str, Any]]:
    """One record per trajectory, in the order of ``tasks`` (the held-out set; a task's repetitions numbered by
    the order they came back). Trajectories of tasks outside ``tasks`` come last."""
    uid = uuid.uuid4().hex[:12]
    order = {t.task_id: i for i, t in enumerate(tasks)}
    seen: dict[str, int] = {}
    out = []
    for tr in sorted(trajectories, key=lambda t: order.get(t.task.task_id, len(order))):
        tid = tr.task.task_id
        k = seen.get(tid, 0)
        seen[tid] = k + 1
        steps = tr.transitions
        out.append({
            "eval_uid": uid, "label": label, "iteration": iteration, "weight_version": tr.weight_version,
            "policy": policy, "run_seed": run_seed, "sampling_seed": sampling_seed,
            "task_id": tid, "task_seed": tr.task.params.get("seed"), "episode": k,
            "success": bool(tr.success), "reward": float(tr.total_reward), "steps": len(steps),
            "unparsable": sum(not t.action_parsed for t in steps),
            "invalid_actions": sum(t.admissible_actions is not None and t.action not in t.admissible_actions
                                   for t in steps),
        })
    return out


def append_records(run_dir: Path, records: Sequence[dict[str, Any]]) -> None:
    with (Path(run_dir) / EVAL_EPISODES).open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the run (a last line cut short by a crash is left out)."""
    path = Path(run_dir) / EVAL_EPISODES
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def final_records(run_dir: Path, policy: str = "policy") -> list[dict[str, Any]]:
    """The episodes of the run's last evaluation of ``policy`` (a re-run evaluation after a resume: its last copy)."""
    mine = [r for r in read_records(run_dir) if r.get("policy") == policy]
    if not mine:
        return []
    last = mine[-1]["eval_uid"]
    return [r for r in mine if r["eval_uid"] == last]
