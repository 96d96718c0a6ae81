"""Records of the experience model: what goes in (a query), what comes back (a prediction), and the
text-level request/reply that crosses the client seam. Plain picklable dataclasses. A query's top-k
demonstrations are the wire type ``dreamgym.types.Demonstration``, the record the replay buffer returns."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from dreamgym.types import Demonstration

#: A chat message, OpenAI style: ``{"role": "system" | "user" | "assistant", "content": str}``.
Message = dict[str, str]


@dataclass(frozen=True)
class HistoryStep:
    """One earlier step of the episode: the action taken and the abstract state it led to."""

    action: str
    state: str


def valid_actions(admissible: Collection[str] | None, action_space: Collection[str] | None) -> Collection[str] | None:
    """The actions a state accepts: its own admissible list where known; in a state the experience model wrote
    (no list), the action space, every action real data accepts somewhere; ``None`` when neither is known."""
    return admissible if admissible is not None else action_space


@dataclass
class ExperienceQuery:
    """Everything the experience model conditions on for one step ``(s_t, a_t)``."""

    env: str
    """Spec of the environment being imitated (``twx:coin``); selects the prompt template."""
    instruction: str
    """The task instruction."""
    state: str
    """The current abstract state ``s_t``."""
    action: str
    """The agent's action ``a_t``."""
    history: list[HistoryStep] = field(default_factory=list)
    """Earlier steps, oldest first (the prompt shows the last ``history_steps`` of them)."""
    demonstrations: list[Demonstration] = field(default_factory=list)
    """Top-k retrieved real transitions, most similar first (the prompt reads their transition fields)."""
    admissible_actions: list[str] | None = None
    """Valid actions in ``s_t`` where known; an action outside this list is settled as a failure."""
    action_space: Collection[str] | None = None
    """Every action real data recorded as valid in some state of this environment, where known. When
    ``s_t``'s own list is unknown (a state the experience model wrote), an action outside this set is settled
    as a failure too: no real state accepts it, so the model must not pay for it (it paid for prose such as
    "You take the coin" and for "take the coin", and the policy learned to write them)."""
    reward_so_far: float = 0.0
    """Reward the episode has earned before this step (the family's reward rule bounds what is left)."""

    def valid_actions(self) -> Collection[str] | None:
        """What the action is judged against: ``s_t``'s admissible list, else the action space (``valid_actions``)."""
        return valid_actions(self.admissible_actions, self.action_space)


@dataclass(frozen=True)
class Sampling:
    """Sampling of one generation. No per-request seed: it crashes vLLM's CPU sampler (the engine
    has one seed, see docs/stack-notes.md)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 384
    stop: tuple[str, ...] = ()

    def with_(self, **changes: Any) -> Sampling:
        return replace(self, **changes)


@dataclass
class CompletionRequest:
    """One chat completion asked of a client."""

    messages: list[Message]
    sampling: Sampling
    query: ExperienceQuery | None = None
    """The query the messages were built from, attached only for a client that reads it instead of the text
    (``ExperienceClient.reads_query``: the ``copy`` backend); never sent over a wire."""


@dataclass
class Completion:
    """A client's reply to one request."""

    text: str
    finish_reason: str = "stop"
    """``stop`` (end of sequence or stop string), ``length`` (token limit), or ``error:<what>`` when
    the backend refused the request (e.g. the prompt does not fit the context)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Of ``prompt_tokens``: those the engine's prefix cache served (not computed again)."""
    engine_steps: int = 0
    """Engine steps booked on this request. The in-process engine books each of its ``step()`` calls on exactly one
    request it ran (with the step's running and waiting request counts and its wall time, the ``engine_*`` fields
    below), so summing over replies counts every step once: ``engine_running / engine_steps`` is the mean batch."""
    engine_running: int = 0
    """Requests the engine ran in the booked steps, summed over them."""
    engine_waiting: int = 0
    """Requests that waited in the booked steps (not scheduled: no room in the KV cache), summed over them."""
    engine_us: int = 0
    """Wall time of the booked steps, microseconds."""
    engine_prefill_steps: int = 0
    """Of the booked steps, those that began with new requests (so computed their prompts' uncached tokens
    beside the running requests' next tokens), and their wall time (``engine_prefill_us``)."""
    engine_prefill_us: int = 0


@dataclass
class Prediction:
    """The experience model's answer for one query: reasoning, then ``(s_{t+1}, r, done, success)``.

    ``valid`` is False when every attempt produced a malformed reply: such a prediction carries no
    next state and must never reach the learner as a valid transition.
    """

    next_state: str
    reward: float
    done: bool
    success: bool
    reasoning: str = ""
    valid: bool = True
    invalid_reason: str = ""
    """Why the last attempt failed to parse (``missing:<reward>``, ``reward:out-of-range``, ...)."""
    attempts: int = 0
    """Model calls spent on this query (0 when the admissible list settled it)."""
    settled: bool = False
    """The environment's admissible list settled the step (inadmissible action: failure state)."""
    raw: str = ""
    """The last raw reply (for debugging and the invalid-reply log)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_reply: Prediction | None = None
    """The model's first sampled reply as parsed, before retries and the reward rule: what the model said on its
    own (an unparsable one is an invalid ``Prediction`` with its reason). ``None`` when no model call was made
    (a settled step). Fidelity evaluations score it beside the final prediction (``dreamgym.experience.fidelity``)."""
