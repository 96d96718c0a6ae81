"""The strict parser of experience-model replies.

A reply is valid only if it holds, in this order and once each, ``<think>`` (when reasoning is on),
``<next_state>``, ``<reward>``, ``<done>`` and ``<success>``, with nothing but whitespace around them;
``next_state`` (and the reasoning) non-empty; ``reward`` a finite number inside the reward range;
``done`` and ``success`` literally ``true`` or ``false`` (any case); ``success`` only with ``done`` and with
a reward above the range's minimum (every supported family pays for the step that completes the task; a
model that predicts a success worth nothing would hand GRPO episodes that succeed without reward).
The final ``</success>`` may be missing at the very end because generation stops on it.

Anything else raises ``MalformedReply`` with a short machine-readable reason
(``missing:<reward>``, ``order:<done>``, ``reward:out-of-range``, ...), which the invalid-transition
accounting counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dreamgym.errors import DreamGymError

TAGS_WITH_REASONING = ("think", "next_state", "reward", "done", "success")
TAGS_WITHOUT_REASONING = ("next_state", "reward", "done", "success")
_BOOLS = {"true": True, "false": False}


class MalformedReply(DreamGymError):
    """A reply that does not follow the format; ``reason`` is a short code for accounting."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class ParsedReply:
    reasoning: str
    next_state: str
    reward: float
    done: bool
    success: bool


def _fields(text: str, tags: tuple[str, ...]) -> dict[str, str]:
    for tag in tags:
        for mark in (f"<{tag}>", f"</{tag}>"):
            if text.count(mark) > 1:
                raise MalformedReply(f"duplicate:<{tag}>")
    out: dict[str, str] = {}
    pos = 0
    for i, tag in enumerate(tags):
        start = text.find(f"<{tag}>", pos)
        if start < 0:
            reason = f"order:<{tag}>" if f"<{tag}>" in text else f"missing:<{tag}>"
            raise MalformedReply(reason)
        between = text[pos:start]
        if any(f"<{t}>" in between for t in tags):
            raise MalformedReply(f"order:<{tag}>")
        if between.strip():
            raise MalformedReply("prefix-text" if i == 0 else f"text-between:<{tags[i - 1]}>/<{tag}>",
                                 between.strip()[:60])
        body_start = start + len(tag) + 2
        end = text.find(f"</{tag}>", body_start)
        last = i == len(tags) - 1
        if end < 0:
            if not last:
                raise MalformedReply(f"unclosed:<{tag}>")
            out[tag], pos = text[body_start:], len(text)
        else:
            out[tag], pos = text[body_start:end], end + len(tag) + 3
        if any(f"<{t}>" in out[tag] for t in tags):
            raise MalformedReply(f"unclosed:<{tag}>")
    if text[pos:].strip():
        raise MalformedReply("trailing-text", text[pos:].strip()[:60])
    return out


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v not in _BOOLS:
        raise MalformedReply(f"{name}:not-a-bool", value.strip()[:20])
    return _BOOLS[v]


def parse_reply(
    text: str, *, reasoning: bool = True, reward_range: tuple[float, float] = (0.0, 1.0)
) -> ParsedReply:
    """Parse one reply strictly (see the module docstring); raise ``MalformedReply`` otherwise."""
    if not text.strip():
        raise MalformedReply("empty")
    f = _fields(text, TAGS_WITH_REASONING if reasoning else TAGS_WITHOUT_REASONING)
    thought = f.get("think", "").strip()
    if reasoning and not thought:
        raise MalformedReply("empty:<think>")
    next_state = f["next_state"].strip()
    if not next_state:
        raise MalformedReply("empty:<next_state>")
    try:
        reward = float(f["reward"].strip())
    except ValueError:
        raise MalformedReply("reward:not-a-number", f["reward"].strip()[:20]) from None
    if not math.isfinite(reward):
        raise MalformedReply("reward:not-a-number", f["reward"].strip()[:20])
    lo, hi = reward_range
    if not lo <= reward <= hi:
        raise MalformedReply("reward:out-of-range", f"{reward} not in [{lo}, {hi}]")
    done = _bool("done", f["done"])
    success = _bool("success", f["success"])
    if success and not done:
        raise MalformedReply("success-without-done")
    if success and reward <= lo:
        raise MalformedReply("success-without-reward", f"reward {reward}")
    return ParsedReply(reasoning=thought, next_state=next_state, reward=reward, done=done, success=success)
