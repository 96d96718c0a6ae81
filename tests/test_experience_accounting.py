"""Invalid-transition accounting: the counters are the dataclass's own fields, and a stretch of work's
share is ``after - before`` (what a rollout worker reports as its ``em_*`` keys)."""

from __future__ import annotations

from dataclasses import fields

from experience_data import HALL, KITCHEN

from dreamgym.experience.accounting import COUNTERS, InvalidAccounting
from dreamgym.experience.client import FunctionClient
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.prompts import format_reply
from dreamgym.experience.retry import RetryPolicy
from dreamgym.experience.schema import Completion, ExperienceQuery


def test_counters_are_every_field_but_reasons() -> None:
    assert {f.name for f in fields(InvalidAccounting)} == {*COUNTERS, "reasons"}
    assert COUNTERS == ("queries", "model_calls", "retries", "valid", "invalid", "recovered", "settled",
                        "unsettled", "rule_unenforced", "first_parsed", "first_rule_ok", "first_final",
                        "first_final_agree", "prompt_tokens", "completion_tokens", "cached_tokens", "engine_steps",
                        "engine_running", "engine_waiting", "engine_us",
                        "engine_prefill_steps", "engine_prefill_us")
    d = InvalidAccounting(queries=4, invalid=1).as_dict()
    assert set(d) == {*COUNTERS, "invalid_rate", "reasons"} and d["invalid_rate"] == 0.25


def test_sum_copy_and_difference() -> None:
    a = InvalidAccounting(queries=2, model_calls=3)
    a.reasons["missing:<reward>"] += 1
    before = a.copy()
    b = InvalidAccounting(queries=1, invalid=1, completion_tokens=7)
    b.reasons["missing:<reward>"] += 2
    a += b
    assert before.queries == 2 and before.reasons == {"missing:<reward>": 1}  # a copy, not a view
    spent = a - before
    assert spent.counts() == b.counts() and spent.reasons == b.reasons


def test_a_models_stats_difference_is_what_the_calls_in_between_counted() -> None:
    replies = iter(["garbage", format_reply(KITCHEN, 1.0, True, True, "north")] * 4)
    model = ExperienceModel(FunctionClient(lambda messages, s: next(replies)), retry=RetryPolicy(max_attempts=2))
    q = ExperienceQuery(env="twx:coin", instruction="Find the coin.", state=HALL, action="go north")
    model.predict_one(q)
    before = model.stats.copy()
    model.predict_one(q)
    spent = model.stats - before
    assert (spent.queries, spent.model_calls, spent.retries, spent.valid, spent.recovered) == (1, 2, 1, 1, 1)
    assert sum(spent.reasons.values()) == 1 and model.stats.queries == 2


def test_token_figures_count_calls_tokens_and_engine_batches_from_the_replies() -> None:
    """The replies' token and engine-step counts reach the tally (a malformed first reply's too: retries are calls),
    and the figures the iteration benchmark reports are their ratios."""
    replies = iter([Completion("garbage", prompt_tokens=100, completion_tokens=10, cached_tokens=40, engine_steps=3,
                               engine_running=9, engine_waiting=1, engine_us=30_000,
                               engine_prefill_steps=1, engine_prefill_us=20_000),
                    Completion(format_reply(KITCHEN, 1.0, True, True, "north"), prompt_tokens=100,
                               completion_tokens=30, cached_tokens=100, engine_steps=1, engine_running=1,
                               engine_us=10_000)])
    model = ExperienceModel(FunctionClient(lambda messages, s: next(replies)), retry=RetryPolicy(max_attempts=2))
    q = ExperienceQuery(env="twx:coin", instruction="Find the coin.", state=HALL, action="go north")
    assert model.predict_one(q).valid
    fig = model.stats.token_figures(transitions=1)
    assert fig == {"calls": 2, "calls_per_transition": 2.0, "calls_per_model_query": 2.0,
                   "prompt_tokens_per_call": 100.0, "generated_tokens_per_call": 20.0, "cached_tokens_per_call": 70.0,
                   "prefix_cache_hit_share": 0.7, "engine_steps": 4, "mean_running_per_step": 2.5,
                   "mean_waiting_per_step": 0.25, "ms_per_step": 10.0, "ms_per_generated_token": 1.0,
                   "engine_busy_s": 0.04, "prefill_steps": 1, "prefill_busy_s": 0.02,
                   "ms_per_prefill_step": 20.0, "ms_per_other_step": 6.67}
    assert InvalidAccounting().token_figures(0)["calls_per_transition"] is None
