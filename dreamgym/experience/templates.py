"""Prompt templates per environment family, all in one place.

A family template says what world the experience model simulates, what the abstract state contains
(the environment adapter's own ``state_rules`` unless the template overrides them), how reward is
given, and what the failure state of an inadmissible action looks like. ``prompts.py`` turns a
template and an ``ExperienceQuery`` into chat messages; ``annotate.py`` uses the same facts to write
template rationales.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class FamilyTemplate:
    family: str
    world: str
    """What the experience model simulates, completing "You simulate ..."."""
    reward_rules: str
    invalid_action_state: str
    """The failure state ``s_{t+1}`` of an inadmissible action (reward 0, the episode goes on)."""
    state_rules: str | None = None
    """What the abstract state contains; ``None``: the environment adapter's ``state_rules``."""
    location_prefix: str | None = None
    """Sentence start naming the agent's location in a state (``You are in the``), for rationales."""


_GENERIC_STATE_RULES = (
    "The state is the text the environment shows after the action: what the agent sees, with markup "
    "and boilerplate removed."
)

TEMPLATES: dict[str, FamilyTemplate] = {
    "twx": FamilyTemplate(
        family="twx",
        world="a TextWorldExpress text game",
        reward_rules=(
            "the reward is the increase of the game's normalised score: 1 when the action completes the "
            "task (the episode then ends with success), otherwise 0."
        ),
        invalid_action_state="Unknown action: I'm not sure what you mean.",
        location_prefix="You are in the",
    ),
    "sciworld": FamilyTemplate(
        family="sciworld",
        world="a ScienceWorld text environment (elementary science experiments)",
        reward_rules=(
            "the reward is the increase of the task score (0 to 1) earned by reaching a sub-goal; the "
            "episode ends with success when the score reaches 1 and with failure on a wrong final answer."
        ),
        invalid_action_state="No known action matches that input.",
        location_prefix="This room is called the",
    ),
    "alfworld": FamilyTemplate(
        family="alfworld",
        world="an ALFWorld household text game",
        reward_rules="the reward is 1 when the action completes the task (the episode ends with success), else 0.",
        invalid_action_state="Nothing happens.",
        location_prefix="You arrive at",
    ),
    "remote": FamilyTemplate(
        family="remote",
        world="a web environment (e.g. an online shop)",
        reward_rules=(
            "the reward is 0 until the episode ends; the final action (e.g. buying a product) earns the "
            "task score between 0 and 1 and ends the episode."
        ),
        invalid_action_state="Invalid action: the page does not change.",
        state_rules=(
            "The state is the visible text of the current page (title, items, prices, buttons), with "
            "HTML markup and boilerplate removed."
        ),
    ),
    "default": FamilyTemplate(
        family="default",
        world="a text environment",
        reward_rules="the reward is given by the environment for progress on the task, between the bounds below.",
        invalid_action_state="Invalid action.",
        state_rules=_GENERIC_STATE_RULES,
    ),
}


def family_of(env_spec: str) -> str:
    """``twx:coin`` -> ``twx``; a synthetic spec ``synthetic:twx:coin`` -> ``twx``."""
    parts = env_spec.split(":")
    if parts[0] == "synthetic" and len(parts) > 1:
        parts = parts[1:]
    return parts[0]


@functools.lru_cache(maxsize=64)
def template_for(env_spec: str) -> FamilyTemplate:
    """The template of ``env_spec``'s family (``default`` for unknown families)."""
    return TEMPLATES.get(family_of(env_spec), TEMPLATES["default"])


@functools.lru_cache(maxsize=64)
def state_rules_for(env_spec: str) -> str:
    """The rules of the abstract state: the template's own, else the adapter class's ``state_rules``."""
    tpl = template_for(env_spec)
    if tpl.state_rules:
        return tpl.state_rules
    try:  # the adapter module is light (engines start lazily), but a family may be missing here
        from dreamgym.envs.registry import adapter_class

        return str(adapter_class(tpl.family).state_rules)
    except Exception:
        return _GENERIC_STATE_RULES
