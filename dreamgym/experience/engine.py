"""An in-process async vLLM engine that answers experience-model requests, and the client around it.

``AsyncEngine`` owns one ``vllm.v1.engine.async_llm.AsyncLLM`` in this process (on CPU the engine core
runs in-process too, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: faster start, less memory) with prefix
caching on, so the constant system prompt of every request is computed once. It renders chat
messages with the model's chat template and sends token ids. The Ray replica
(``actors/experience_model.py``) wraps one; ``InProcessClient`` runs one on a background event-loop
thread for scripts and the CLI that do not use Ray.

vLLM reads its environment variables at import, so ``engine_env`` must be applied before the first
``import vllm`` in the process (the Ray replica passes them as its ``runtime_env``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dreamgym.experience.client import ExperienceClient
from dreamgym.experience.schema import Completion, CompletionRequest, Message, Sampling


@dataclass(frozen=True)
class EngineOptions:
    """How to build the engine (see ``config.ExperienceModelConfig`` for each field's meaning)."""

    model: str
    dtype: str = "bfloat16"
    max_model_len: int = 4096
    prefix_caching: bool = True
    enforce_eager: bool = True
    seed: int = 0
    kv_cache_gib: float = 1.0
    omp_threads: int = 2
    cpu_bind: str | None = None
    device: str = "cpu"
    gpu_memory_utilization: float = 0.85


def engine_env(opts: EngineOptions) -> dict[str, str]:
    """Environment variables the engine needs, set before vLLM is imported (the policy engine's, plus
    the CPU thread binding of this replica)."""
    from dreamgym.vllm_engine import engine_env as base_env

    env = base_env(opts.device, opts.omp_threads)
    if opts.cpu_bind and opts.device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = opts.cpu_bind
    return env


def render_chat(tokenizer: Any, messages: list[Message]) -> str:
    """The prompt text of ``messages`` under the model's chat template (a plain fallback without one)."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


class AsyncEngine:
    """One async vLLM engine; ``generate_batch`` runs a batch of chat requests concurrently."""

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts
        self.engine: Any = None
        self.tokenizer: Any = None
        self.inflight = 0
        """Requests currently inside the engine (the router's load signal)."""
        self.served = 0

    def start(self) -> None:
        """Build the engine (tens of seconds on CPU). Call from the thread that runs its event loop."""
        if self.engine is not None:
            return
        for k, v in engine_env(self.opts).items():
            os.environ.setdefault(k, v)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kw: dict[str, Any] = {}
        if self.opts.device == "cuda":
            kw["gpu_memory_utilization"] = self.opts.gpu_memory_utilization
        else:
            kw["kv_cache_memory_bytes"] = int(self.opts.kv_cache_gib * 2**30)
        args = AsyncEngineArgs(
            model=self.opts.model, dtype=self.opts.dtype, max_model_len=self.opts.max_model_len,
            enable_prefix_caching=self.opts.prefix_caching, enforce_eager=self.opts.enforce_eager,
            seed=self.opts.seed, disable_log_stats=True, **kw,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self.tokenizer = self.engine.get_tokenizer()

    def render(self, messages: list[Message]) -> list[int]:
        return list(self.tokenizer.encode(render_chat(self.tokenizer, messages), add_special_tokens=False))

    def sampling_params(self, s: Sampling, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        max_tokens = max(1, min(s.max_tokens, self.opts.max_model_len - prompt_len))
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=max_tokens,
                              stop=list(s.stop) or None, output_kind=RequestOutputKind.FINAL_ONLY)

    async def generate_ids(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        """Generate from token ids (the raw engine path the benchmark compares against)."""
        from vllm.inputs import TokensPrompt

        if len(prompt_ids) >= self.opts.max_model_len:
            return Completion("", f"error:prompt-too-long ({len(prompt_ids)} >= {self.opts.max_model_len} tokens)",
                              prompt_tokens=len(prompt_ids))
        self.inflight += 1
        try:
            final = None
            params = self.sampling_params(sampling, len(prompt_ids))
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params,
                                                  request_id=uuid.uuid4().hex):
                final = out
        finally:
            self.inflight -= 1
        self.served += 1
        assert final is not None
        o = final.outputs[0]
        return Completion(text=o.text, finish_reason=str(o.finish_reason or "stop"),
                          prompt_tokens=len(prompt_ids), completion_tokens=len(o.token_ids))

    async def generate(self, request: CompletionRequest) -> Completion:
        return await self.generate_ids(self.render(request.messages), request.sampling)

    async def generate_batch(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class InProcessClient(ExperienceClient):
    """An ``ExperienceClient`` over an ``AsyncEngine`` running on a background event-loop thread."""

    def __init__(self, opts: EngineOptions, timeout_s: float = 600.0) -> None:
        self.engine = AsyncEngine(opts)
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dreamgym-vllm-loop", daemon=True)
        self._thread.start()
        self._call(self._start())

    async def _start(self) -> None:
        self.engine.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=self.timeout_s)

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        return self._call(self.engine.generate_batch(list(requests)))  # type: ignore[no-any-return]

    def complete_ids(self, prompts: Sequence[list[int]], sampling: Sampling) -> list[Completion]:
        """Raw generation from token ids, bypassing prompting and parsing (benchmarks)."""
        async def run() -> list[Completion]:
            return list(await asyncio.gather(*(self.engine.generate_ids(p, sampling) for p in prompts)))

        return self._call(run())  # type: ignore[no-any-return]

    def render(self, messages: list[Message]) -> list[int]:
        return self.engine.render(messages)

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def stop() -> None:
            self.engine.shutdown()

        try:
            self._call(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()
