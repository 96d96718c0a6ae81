"""How a transition becomes a stored point: its id, its payload, the text ``phi`` embeds, its shard.

A point in the replay store is ``(id, phi(s_t, a_t), payload)``:

- **id**: a UUID taken from the SHA-256 of the transition's *content* (what the experience model would
  see as a demonstration). Two transitions with the same content get the same id, so an exact duplicate
  is stored once, a retried write is harmless, and every process (driver, shard, restore) computes the
  same id without asking anyone.
- **payload**: the filterable fields as their own keys (``env``, ``env_family``, ``task_id``,
  ``task_family``, ``source``, ``policy``, ``iteration``, ``policy_version``, ``seq``) and the rest of the
  transition (its columns of the transitions Parquet schema) as one JSON string under ``transition``.
  Packing matters: the Qdrant engine converts a Python payload key by key, and a transition unpacked
  into ~30 keys and list items made the conversion cost more than the storage write itself.
- **shard**: a stable hash of the id (not Python's salted ``hash``), so a transition always lands on the
  same one of the S shards.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import uuid
from typing import Any

from dreamgym.types import Transition

#: Content fields hashed into the point id. Episode, step, task id, policy and the run metadata are left
#: out on purpose: the same (instruction, s, a, s', r, done) seen in two episodes is one demonstration.
#: ``source`` is kept so a synthetic copy of a real transition can never replace (and later evict) it.
CONTENT_FIELDS = ("env", "instruction", "state", "action", "next_state", "reward", "done", "success", "source")

#: Transition fields stored in the payload: the columns of the transitions Parquet schema (plus ``valid``).
#: Policy-token fields (prompt/action token ids, log-probs) are training data, not demonstrations.
TRANSITION_FIELDS = (
    "episode_id", "step", "task_id", "env", "instruction", "state", "action", "next_state", "reward", "done",
    "success", "admissible_actions", "source", "policy", "valid",
)

#: Payload keys of their own (filterable; see ``filters.FILTER_FIELDS``). The rest goes to ``BLOB``.
PAYLOAD_KEYS = ("env", "env_family", "task_id", "task_family", "source", "policy", "iteration", "policy_version",
                "seq")
#: Payload key of the JSON-packed remainder of the transition.
BLOB = "transition"
_BLOB_FIELDS = tuple(f for f in TRANSITION_FIELDS if f not in PAYLOAD_KEYS)

_SEED_SEGMENT = re.compile(r"^(seed|variation|episode)=[^/]*$")
_SPLITS = {"train", "dev", "test"}


def point_id(t: Transition | dict[str, Any]) -> str:
    """The content-hash UUID of a transition (stable across processes, platforms and runs)."""
    # Attribute access, not ``asdict``: this runs for every transition written (asdict deep-copies).
    get = t.get if isinstance(t, dict) else lambda k: getattr(t, k)
    texts = (get("env"), get("instruction") or "", get("state"), get("action"), get("next_state"),
             get("source") or "real")
    # Length-prefixed fields: unambiguous whatever characters the texts contain.
    body = "".join(f"{len(x)}:{x}" for x in texts)
    body += f"|{float(get('reward'))!r}|{int(bool(get('done')))}{int(bool(get('success')))}"
    digest = hashlib.sha256(body.encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=5))


def shard_of(pid: str, num_shards: int) -> int:
    """The shard that owns point ``pid``: its UUID's leading 64 bits modulo ``num_shards``."""
    return int(uuid.UUID(pid).hex[:16], 16) % num_shards


@functools.lru_cache(maxsize=4096)
def env_family(env: str) -> str:
    """``twx:coin`` -> ``twx``."""
    return env.split(":", 1)[0]


@functools.lru_cache(maxsize=65536)
def task_family(task_id: str) -> str:
    """The task with its instance removed: split and ``seed=``/``variation=`` path segments are dropped.

    ``twx:coin/train/seed=7/numLocations=3`` -> ``twx:coin/numLocations=3``: every seed of the same game
    parameters is one family, so retrieval can stay within tasks of the same shape.
    """
    parts = [p for p in task_id.split("/") if p not in _SPLITS and not _SEED_SEGMENT.match(p)]
    return "/".join(parts)


def phi_text(state: str, action: str) -> str:
    """The text embedded as ``phi(s, a)``.

    The action comes first because sentence encoders truncate long inputs at the end
    (all-MiniLM-L6-v2 at 256 word pieces): a long state must not push the action out.
    """
    return f"action: {action}\nstate: {state}"


def point_payload(t: Transition, iteration: int, policy_version: int, seq: int) -> dict[str, Any]:
    """The stored payload of a transition: filter fields and metadata as keys, the rest packed."""
    rest = {k: getattr(t, k) for k in _BLOB_FIELDS}
    rest["step"] = int(rest["step"])
    rest["reward"] = float(rest["reward"])
    if rest["admissible_actions"] is not None:
        rest["admissible_actions"] = list(rest["admissible_actions"])
    return {
        "env": t.env, "env_family": env_family(t.env), "task_id": t.task_id, "task_family": task_family(t.task_id),
        "source": t.source, "policy": t.policy, "iteration": int(iteration), "policy_version": int(policy_version),
        "seq": int(seq), BLOB: json.dumps(rest, ensure_ascii=False, separators=(",", ":")),
    }


def payload_transition(payload: dict[str, Any]) -> Transition:
    """Rebuild the ``Transition`` a payload was made from."""
    fields = json.loads(payload[BLOB])
    fields.update({k: payload[k] for k in ("env", "task_id", "source", "policy")})
    return Transition(**fields)
