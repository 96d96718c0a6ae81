"""Each family's reward rule, and the experience model refusing replies that break it (retried, then invalid)."""

from __future__ import annotations

import pytest

from dreamgym.envs.reward_rules import reward_rule
from dreamgym.experience.client import FunctionClient
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.prompts import PromptOptions, format_reply
from dreamgym.experience.retry import RetryPolicy
from dreamgym.experience.schema import ExperienceQuery


@pytest.mark.parametrize(("env", "rule"), [
    ("twx:coin", "outcome"), ("twx:twc", "progress"), ("sciworld:boil", "progress"), ("alfworld:/g.tw-pddl", "outcome"),
    ("remote:webshop", "final-score"), ("remote:webarena", "outcome"), ("synthetic:twx:coin", "outcome"),
    ("mystery:game", "free"),
])
def test_each_family_has_its_written_rule(env: str, rule: str) -> None:
    assert reward_rule(env).name == rule


def test_coin_pays_one_once_on_the_step_that_takes_the_coin() -> None:
    coin = reward_rule("twx:coin")
    assert coin.violation(1.0, True, True) is None  # take coin
    assert coin.violation(0.0, False, False) is None  # move west
    assert coin.violation(1.0, False, False) == "rule:reward-without-success"  # `look around` paid 1
    assert coin.violation(1.0, True, False) == "rule:reward-without-success"
    assert coin.violation(0.5, True, True) == "rule:success-without-full-reward"
    assert coin.violation(0.0, False, True) == "rule:success-without-done"


def test_progress_rewards_add_up_to_the_full_score_exactly_on_success() -> None:
    sci = reward_rule("sciworld:boil")
    assert sci.violation(0.25, False, False, reward_so_far=0.5) is None
    assert sci.violation(0.5, True, True, reward_so_far=0.5) is None
    assert sci.violation(0.5, False, False, reward_so_far=0.75) == "rule:over-total"
    assert sci.violation(-0.1, False, False) == "rule:negative-reward"
    assert sci.violation(0.25, True, True, reward_so_far=0.25) == "rule:success-below-total"
    assert sci.violation(0.0, True, False, reward_so_far=0.0) is None  # a failed episode scores 0


def test_a_shop_pays_a_graded_score_at_the_purchase() -> None:
    shop = reward_rule("remote:webshop")
    assert shop.violation(0.0, False, False) is None and shop.violation(0.6, True, False) is None
    assert shop.violation(1.0, True, True) is None
    assert shop.violation(0.6, False, False) == "rule:reward-before-end"
    assert shop.violation(0.6, True, True) == "rule:success-not-full-score"


def _query(**kw: object) -> ExperienceQuery:
    base: dict[str, object] = {"env": "twx:coin", "instruction": "Find the coin.",
                               "state": "You are in the kitchen.", "action": "look around"}
    base.update(kw)
    return ExperienceQuery(**base)  # type: ignore[arg-type]


def test_the_experience_model_retries_then_refuses_a_reply_that_breaks_the_rule() -> None:
    """The default run's failure, replayed: `look around` paid 1 without ending the episode."""
    paid_look = format_reply("You are in the kitchen.", 1.0, False, False, "looking around")
    model = ExperienceModel(FunctionClient(lambda m, s: paid_look), PromptOptions(top_k=0),
                            retry=RetryPolicy(max_attempts=2))
    pred = model.predict_one(_query())
    assert not pred.valid and pred.invalid_reason == "rule:reward-without-success" and pred.attempts == 2
    assert model.stats.invalid == 1 and model.stats.reasons["rule:reward-without-success"] == 2

    replies = iter([paid_look, format_reply("You are in the kitchen.", 0.0, False, False, "looking around")])
    model = ExperienceModel(FunctionClient(lambda m, s: next(replies)), PromptOptions(top_k=0),
                            retry=RetryPolicy(max_attempts=2))
    pred = model.predict_one(_query())
    assert pred.valid and pred.reward == 0.0 and model.stats.recovered == 1

    unchecked = ExperienceModel(FunctionClient(lambda m, s: paid_look), PromptOptions(top_k=0),
                                check_reward_rule=False)
    assert unchecked.predict_one(_query()).valid  # the switch turns the check off (for ablations)


def test_a_progress_family_bounds_the_episode_total() -> None:
    over = format_reply("The water boils.", 0.5, False, False, "heating")
    model = ExperienceModel(FunctionClient(lambda m, s: over), PromptOptions(top_k=0),
                            retry=RetryPolicy(max_attempts=1))
    assert model.predict_one(_query(env="sciworld:boil", reward_so_far=0.25)).valid
    assert model.predict_one(_query(env="sciworld:boil", reward_so_far=0.75)).invalid_reason == "rule:over-total"
