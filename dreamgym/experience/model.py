"""``ExperienceModel``: the reasoning experience model on top of any ``ExperienceClient``.

For each query ``(task, history, s_t, a_t, top-k demonstrations)`` it builds the prompt, asks the
client, parses the reply strictly, checks it against the family's reward rule
(``dreamgym.envs.reward_rules``) and retries malformed replies with the documented change of
sampling (``retry.py``); a query still malformed after the last attempt becomes an *invalid*
prediction. All queries of a call are sent as one batch per attempt, so a backend runs them
concurrently.

Inadmissible actions follow the paper: the next state is the family's failure state with reward 0 and
the episode goes on. When the environment's admissible list is known and excludes the action
(``inadmissible='settle'``), this is decided here without a model call; otherwise the model decides
(the system prompt states the rule).

With a rule switched off (``inadmissible='model'``, ``check_reward_rule=False``: the study's ``no-rules`` arm) the
rule still *counts* what it would have done (``InvalidAccounting.unsettled``, ``rule_unenforced``). Every query's
first reply is scored against the reward rule and against the step's final outcome (``first_rule_ok``,
``first_final_agree``): the model's own accuracy, which the rules' resampling would otherwise hide.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from dreamgym.envs.reward_rules import EPS, reward_rule
from dreamgym.experience.accounting import InvalidAccounting
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.parser import MalformedReply, parse_reply
from dreamgym.experience.prompts import STOP, PromptOptions, build_messages
from dreamgym.experience.retry import RetryPolicy
from dreamgym.experience.schema import Completion, CompletionRequest, ExperienceQuery, Prediction, Sampling
from dreamgym.experience.templates import template_for


class ExperienceModel:
    def __init__(
        self,
        client: ExperienceClient,
        prompt: PromptOptions | None = None,
        sampling: Sampling | None = None,
        retry: RetryPolicy | None = None,
        inadmissible: str = "settle",
        check_reward_rule: bool = True,
    ) -> None:
        if inadmissible not in ("settle", "model"):
            raise ValueError(f"inadmissible must be 'settle' or 'model', got {inadmissible!r}")
        self.client = client
        self.prompt = prompt or PromptOptions()
        base = sampling or Sampling()
        self.sampling = base if base.stop else base.with_(stop=STOP)
        self.retry = retry or RetryPolicy()
        self.inadmissible = inadmissible
        self.check_reward_rule = check_reward_rule
        self.stats = InvalidAccounting()
        self.busy_s = 0.0
        """Wall time spent inside ``predict`` (summed over concurrent callers)."""
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def ruled_out(q: ExperienceQuery) -> bool:
        """Whether the state's admissible list (or, for a state without one, the environment's action space)
        rules the action out, whether or not settling is on."""
        valid = q.valid_actions()
        return valid is not None and q.action not in valid

    def settle(self, q: ExperienceQuery) -> Prediction | None:
        """The failure-state prediction when the state's admissible list (or, for a state without one, the
        environment's action space) rules the action out, else None."""
        if self.inadmissible != "settle" or not self.ruled_out(q):
            return None
        return self.failure_state(q)

    @staticmethod
    def failure_state(q: ExperienceQuery) -> Prediction:
        """What the rules decide for an action they rule out: the family's failure state, reward 0, not done."""
        where = "in this state" if q.admissible_actions is not None else "of this environment"
        return Prediction(
            next_state=template_for(q.env).invalid_action_state, reward=0.0, done=False, success=False,
            reasoning=f"'{q.action}' is not one of the valid actions {where}, so the environment does "
                      "not carry it out: failure state, reward 0, the episode goes on.",
            settled=True,
        )

    def predict_one(self, q: ExperienceQuery) -> Prediction:
        return self.predict([q])[0]

    def predict(self, queries: Sequence[ExperienceQuery]) -> list[Prediction]:
        """Predictions for ``queries``, in order (see the module docstring). Thread-safe: rollout
        threads may share one model; each call counts into its own tally, merged at the end."""
        t0 = time.perf_counter()
        st = InvalidAccounting()
        out: list[Prediction | None] = [None] * len(queries)
        pending: list[tuple[int, list[dict[str, str]], Sampling]] = []
        for i, q in enumerate(queries):
            settled = self.settle(q)
            if settled is not None:
                out[i] = settled
                st.settled += 1
            else:
                st.unsettled += self.ruled_out(q)  # settling is off: the rule only counts
                pending.append((i, build_messages(q, self.prompt), self.sampling))
        st.queries += len(queries)
        failed_once: set[int] = set()
        first_reply: dict[int, Prediction] = {}
        attempt = 0
        with_query = self.client.reads_query
        try:
            while pending:
                attempt += 1
                replies = self.client.complete([CompletionRequest(m, s, queries[i] if with_query else None)
                                                for i, m, s in pending])
                if len(replies) != len(pending):
                    raise RuntimeError(f"client returned {len(replies)} completions for {len(pending)} requests")
                st.model_calls += len(pending)
                if attempt > 1:
                    st.retries += len(pending)
                retry: list[tuple[int, list[dict[str, str]], Sampling]] = []
                for (i, messages, sampling), reply in zip(pending, replies, strict=True):
                    st.add_reply(reply)
                    pred, first = self._parse(reply, attempt, queries[i], st)
                    if first is not None:
                        first_reply[i] = first
                    pred.first_reply = first_reply.get(i)
                    if pred.valid:
                        out[i] = pred
                        st.valid += 1
                        st.recovered += i in failed_once
                        if pred.first_reply is not None and pred.first_reply.valid:
                            st.first_final += 1
                            st.first_final_agree += abs(pred.first_reply.reward - pred.reward) <= EPS
                        continue
                    failed_once.add(i)
                    st.reasons[pred.invalid_reason] += 1
                    if self.retry.should_retry(attempt, reply):
                        retry.append((i, messages, self.retry.next_sampling(sampling, reply)))
                    else:
                        out[i] = pred
                        st.invalid += 1
                pending = retry
        finally:
            with self._lock:
                self.stats += st
                self.busy_s += time.perf_counter() - t0
        return [p for p in out if p is not None]

    def _parse(self, reply: Completion, attempt: int, q: ExperienceQuery,
               st: InvalidAccounting) -> tuple[Prediction, Prediction | None]:
        """The prediction of one reply, and on the first attempt that reply as parsed, reward rule not applied
        (``Prediction.first_reply``: the model's own answer, before retries and rules; an unparsable one is an
        invalid prediction). The reward rule is always evaluated: it refuses the reply when ``check_reward_rule``
        is on, and is only counted (``rule_unenforced``) when it is off."""
        common = {"attempts": attempt, "raw": reply.text, "prompt_tokens": reply.prompt_tokens,
                  "completion_tokens": reply.completion_tokens}

        def failed(reason: str) -> tuple[Prediction, Prediction | None]:
            bad = Prediction("", 0.0, False, False, valid=False, invalid_reason=reason, **common)
            return bad, (replace(bad) if attempt == 1 else None)

        if reply.finish_reason.startswith("error"):
            return failed(reply.finish_reason)
        try:
            p = parse_reply(reply.text, reasoning=self.prompt.reasoning,
                            reward_range=(self.prompt.reward_min, self.prompt.reward_max))
        except MalformedReply as e:
            reason = e.reason
            if reply.finish_reason == "length" and reason.startswith(("missing", "unclosed")):
                reason = "truncated"
            return failed(reason)
        broken = reward_rule(q.env).violation(p.reward, p.done, p.success, q.reward_so_far, self.prompt.reward_max)
        parsed = Prediction(p.next_state, p.reward, p.done, p.success, reasoning=p.reasoning, **common)
        first = None
        if attempt == 1:
            st.first_parsed += 1
            st.first_rule_ok += broken is None
            first = replace(parsed)
        if broken is not None and self.check_reward_rule:
            return Prediction("", 0.0, False, False, valid=False, invalid_reason=broken, **common), first
        st.rule_unenforced += broken is not None
        return parsed, first
