"""The text generator that proposes and selects task variants: prompts in, texts out.

The curriculum needs nothing from the experience model but plain text generation, so it is written
against the ``TextGenerator`` protocol: any callable ``(prompts, *, temperature, max_tokens) ->
texts`` (one text per prompt, in order; each prompt is one user message). ``ClientTextGenerator``
adapts the experience model's client seam (``dreamgym.experience.client.ExperienceClient``: the
in-process vLLM engine, the Ray replicas, or an OpenAI-compatible HTTP server) to it.

A request the backend refused comes back as ``GENERATOR_ERROR_PREFIX + reason``; the curriculum
records it as a rejection with reason ``generator_error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dreamgym.experience.client import ExperienceClient
    from dreamgym.experience.engine import EngineOptions

GENERATOR_ERROR_PREFIX = "[generator error] "


class TextGenerator(Protocol):
    """Generates one reply per prompt."""

    def __call__(self, prompts: Sequence[str], *, temperature: float, max_tokens: int) -> list[str]: ...


class ClientTextGenerator:
    """``TextGenerator`` over an ``ExperienceClient`` (the experience model's client seam)."""

    def __init__(self, client: ExperienceClient, system: str | None = None) -> None:
        self.client = client
        self.system = system
        """Optional system message put before every prompt."""

    def close(self) -> None:
        self.client.close()

    def __call__(self, prompts: Sequence[str], *, temperature: float, max_tokens: int) -> list[str]:
        from dreamgym.experience.schema import CompletionRequest, Sampling

        sampling = Sampling(temperature=temperature, max_tokens=max_tokens)
        head = [{"role": "system", "content": self.system}] if self.system else []
        requests = [CompletionRequest(messages=[*head, {"role": "user", "content": p}], sampling=sampling)
                    for p in prompts]
        replies = self.client.complete(requests)
        if len(replies) != len(requests):
            raise RuntimeError(f"the experience-model client answered {len(replies)} of {len(requests)} requests")
        return [GENERATOR_ERROR_PREFIX + c.finish_reason if c.finish_reason.startswith("error") else c.text
                for c in replies]


def engine_generator(options: EngineOptions, system: str | None = None) -> ClientTextGenerator:
    """A generator over an in-process vLLM engine (``dreamgym.experience.engine.InProcessClient``).

    Meant as a ``generator_factory`` (``functools.partial(engine_generator, options)``) so the engine
    is built inside the process that uses it, e.g. the curriculum actor."""
    from dreamgym.experience.engine import InProcessClient

    return ClientTextGenerator(InProcessClient(options), system=system)
