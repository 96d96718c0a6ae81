"""Prompts of text-variant generation, in the spirit of the paper's task generator.

Step 1 (propose, sampled ``m`` times per parent): given a parent task ``tau`` that sits at the edge
of the policy's ability (high ``V_tau``), write one new task that is harder but feasible, meaningfully
different and realistic. Each of the ``m`` prompts names a different aspect to vary, so the
candidates differ from each other and not only from the parent.
Step 2 (select, greedy): the valid candidates are listed and the model picks the best one.

Replies are parsed strictly enough to catch garbage (``parse_task_reply``, ``parse_choice``); the
curriculum validates the parsed instruction further (``dreamgym.curriculum.grammar``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: What each of the ``m`` proposals is asked to change (cycled).
ASPECTS = (
    "change which object must be found, used or placed",
    "add one more sub-goal that must be done first",
    "add a constraint on where or how it must be done",
    "require exploring more of the environment",
)


def propose_prompt(env: str, world: str, parent: str, examples: Sequence[str], aspect: str) -> str:
    shown = "\n".join(f"- {e}" for e in examples) or "- (none)"
    return (
        f"You design practice tasks for an AI agent that acts in {world} ({env}).\n"
        f"Tasks of this environment look like this:\n{shown}\n\n"
        "The agent currently solves the following task about half of the time, so tasks like it are "
        f"where it learns most:\nTask: {parent}\n\n"
        "Write one new task for the same environment that is\n"
        "1. harder but still feasible: it needs a few more steps or one more requirement, and it can be "
        "completed with the objects, places and actions this environment has;\n"
        f"2. meaningfully different, not a rewording: {aspect};\n"
        "3. realistic: something a user of this environment would ask, in the style of the tasks above.\n"
        "Reply with one line and nothing else, in this form:\n"
        "Task: <the new task>"
    )


def select_prompt(env: str, world: str, parent: str, candidates: Sequence[str]) -> str:
    listed = "\n".join(f"{i}. {c}" for i, c in enumerate(candidates, start=1))
    return (
        f"You review practice tasks for an AI agent that acts in {world} ({env}).\n"
        f"Original task: {parent}\n\n"
        f"Candidate new tasks:\n{listed}\n\n"
        "Choose the candidate that is harder than the original but still feasible, meaningfully "
        "different from it, and realistic for this environment.\n"
        "Reply with one line and nothing else, in this form:\n"
        "Choice: <number>"
    )


_TASK_LINE = re.compile(r"^\s*(?:\*\*)?(?:new\s+)?task\s*(?:\*\*)?\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_CHOICE = re.compile(r"choice\s*:?\s*\**\s*(\d+)", re.IGNORECASE)


def parse_task_reply(reply: str) -> tuple[str | None, str]:
    """The instruction in a proposal reply, or ``(None, why)``.

    The ``Task:`` line is taken when there is one; a reply of a single line without it is taken
    whole. Surrounding quotes and markdown emphasis are stripped.
    """
    text = reply.strip()
    m = _TASK_LINE.search(text)
    if m:
        text = m.group(1)
    elif "\n" in text:
        return None, "no 'Task:' line in a multi-line reply"
    text = text.strip().strip("*\"'` ").strip()
    if not text:
        return None, "empty task"
    return text, ""


def parse_choice(reply: str, n: int) -> int | None:
    """0-based index of the chosen candidate (``Choice: k``, else the first number 1..n), or ``None``."""
    m = _CHOICE.search(reply)
    numbers = [m.group(1)] if m else re.findall(r"\b(\d+)\b", reply)
    for s in numbers:
        k = int(s)
        if 1 <= k <= n:
            return k - 1
    return None
