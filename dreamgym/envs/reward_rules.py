"""How each environment family pays reward, written down once and checked on every synthetic step.

A real environment pays by its own rules; the experience model only imitates them. A simulator that pays
reward the real game never pays (``look around`` worth 1, an episode that ends in success without the step
that completes the task) teaches the policy to do exactly that, and it then fails in the real environment.
So every synthetic step is checked against its family's rule, and a reply that breaks it is invalid (the
experience model retries it, then the transition is dropped and counted by reason, like a malformed reply).

The rules, with ``R`` the reward bound (``experience_model.reward_max``, 1 by default):

``outcome`` (the paper's outcome reward; ALFWorld, TextWorldExpress ``coin``, WebArena)
    every step pays 0 except the step that completes the task, which pays ``R``, ends the episode and is a
    success; nothing else is a success. So ``coin`` pays 1 once, on the step that takes the coin.
``progress`` (ScienceWorld, the other TextWorldExpress games)
    a step pays the increase of the task score (``>= 0``), the rewards of an episode add up to at most ``R``,
    and an episode is a success exactly when it ends with the score at ``R``. A failed episode scores 0 (the
    real adapters count failure as 0, so local and remote ScienceWorld agree).
``final-score`` (WebShop and other shop-like servers)
    every step before the last pays 0; the last one (the purchase) pays a graded score in ``[0, R]`` and is a
    success exactly when the score is ``R``.
``free`` (families with no written rule)
    any reward in the range; a success must end the episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RuleName = Literal["outcome", "progress", "final-score", "free"]

#: Tolerance of reward comparisons (rewards are parsed from text).
EPS = 1e-6


@dataclass(frozen=True)
class RewardRule:
    name: RuleName
    description: str
    """The rule in one sentence, as the experience model's prompt states it."""

    def violation(self, reward: float, done: bool, success: bool, reward_so_far: float = 0.0,
                  reward_max: float = 1.0) -> str | None:
        """Why a step ``(reward, done, success)`` after ``reward_so_far`` breaks the rule (a short code for
        the invalid-transition accounting), or ``None`` when it follows it."""
        if success and not done:
            return "rule:success-without-done"
        full = abs(reward - reward_max) <= EPS
        if self.name == "outcome":
            if success and not full:
                return "rule:success-without-full-reward"
            if reward > EPS and not success:
                return "rule:reward-without-success"
        elif self.name == "progress":
            if reward < -EPS:
                return "rule:negative-reward"
            total = reward_so_far + reward
            if total > reward_max + EPS:
                return "rule:over-total"
            if success and abs(total - reward_max) > EPS:
                return "rule:success-below-total"
            if done and not success and abs(total - reward_max) <= EPS:
                return "rule:full-total-without-success"
        elif self.name == "final-score":
            if reward > EPS and not done:
                return "rule:reward-before-end"
            if done and success != full:
                return "rule:success-not-full-score"
        return None


RULES: dict[str, RewardRule] = {
    "outcome": RewardRule("outcome", "every step pays 0 except the one that completes the task: it pays the "
                                     "full reward, ends the episode and is a success; nothing else is a success."),
    "progress": RewardRule("progress", "a step pays the increase of the task score (never negative); an "
                                       "episode's rewards add up to at most the full reward, and it is a success "
                                       "exactly when it ends with the full score."),
    "final-score": RewardRule("final-score", "every step pays 0 until the last one (e.g. the purchase), which "
                                             "pays a score between 0 and the full reward; the episode is a success "
                                             "exactly when that score is full."),
    "free": RewardRule("free", "the environment pays for progress on the task, within the reward bounds; a "
                               "success ends the episode."),
}

#: Rule per environment spec or family; the most specific entry wins (``twx:coin`` before ``twx``).
RULE_OF: dict[str, RuleName] = {
    "twx:coin": "outcome",
    "twx": "progress",
    "sciworld": "progress",
    "alfworld": "outcome",
    "remote:webshop": "final-score",
    "remote:webarena": "outcome",
    "remote:alfworld": "outcome",
    "remote:sciworld": "progress",
    "remote:textcraft": "outcome",
    "toy": "outcome",
}


def reward_rule(env_spec: str) -> RewardRule:
    """The reward rule of ``env_spec`` (``twx:coin``, ``remote:webshop``, ``synthetic:twx:coin``, ...)."""
    spec = env_spec.removeprefix("synthetic:")
    parts = spec.split(":")
    # ``remote:webshop`` and ``twx:coin/extra`` both match on their first two fields, then the family.
    for key in (":".join(parts[:2]).split("/")[0], parts[0]):
        if key in RULE_OF:
            return RULES[RULE_OF[key]]
    return RULES["free"]
