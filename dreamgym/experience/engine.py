"""An in-process vLLM engine with an asyncio interface, and the client around it.

``AsyncEngine`` owns one ``vllm.v1.engine.llm_engine.LLMEngine`` whose engine core runs in this very
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: on CPU it starts several times faster and takes about a
gigabyte less than a separate core process, see docs/stack-notes.md; vLLM's ``AsyncLLM`` always spawns one). A
dedicated stepping thread adds the requests that arrive and calls ``step()`` while any is unfinished,
so requests that arrive while others run join the running batch (continuous batching); each caller
awaits an asyncio future the thread resolves. Prefix caching is on, so the constant system prompt of
every request is computed once. Chat messages are rendered with the model's chat template and sent as
token ids. Each reply carries what the engine did for it (``Completion.cached_tokens``, and the ``engine_*`` counts
of the steps booked on it: every ``step()`` is booked once, on one request it ran), so the callers' tallies show
the batches the engine really ran. ``speculative_tokens`` turns on vLLM's prompt-lookup (n-gram) speculative
decoding: a reply that copies its prompt (a next state repeating a demonstration's) takes fewer steps.

The Ray replica (``actors/experience_model.py``) wraps one; ``InProcessClient`` runs one for scripts
and the CLI that do not use Ray. vLLM reads its environment variables when it is imported, so
``engine_env`` must be in the process environment before the first ``import vllm`` (the Ray replica
passes them as its ``runtime_env``; ``start`` sets any that are missing).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
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
    tensor_parallel_size: int = 1
    speculative_tokens: int = 0


#: Prompt-lookup proposals match the reply's last 2 to 4 tokens in the prompt (vLLM's n-gram proposer).
NGRAM_MIN, NGRAM_MAX = 2, 4


def speculative_config(tokens: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for prompt-lookup decoding of up to ``tokens`` draft tokens (None: off)."""
    if tokens <= 0:
        return None
    return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_min": NGRAM_MIN,
            "prompt_lookup_max": NGRAM_MAX}


def engine_env(opts: EngineOptions) -> dict[str, str]:
    """Environment variables the engine needs, set before vLLM is imported (the policy engine's, plus
    the CPU thread binding of this replica)."""
    from dreamgym.vllm_engine import engine_env as base_env

    env = base_env(opts.device, opts.omp_threads, opts.enforce_eager)
    if opts.cpu_bind and opts.device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = opts.cpu_bind
    return env


def render_chat(tokenizer: Any, messages: list[Message]) -> str:
    """The prompt text of ``messages`` under the model's chat template (a plain fallback without one)."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


@dataclass
class _Pending:
    future: asyncio.Future[Completion]
    loop: asyncio.AbstractEventLoop
    prompt_tokens: int
    steps: int = 0
    """Engine steps booked on this request (``Completion.engine_steps``), and their totals below."""
    running: int = 0
    waiting: int = 0
    us: int = 0
    prefill_steps: int = 0
    prefill_us: int = 0


class AsyncEngine:
    """One in-process vLLM engine; ``generate_batch`` runs a batch of chat requests concurrently."""

    def __init__(self, opts: EngineOptions) -> None:
        self.opts = opts
        self.engine: Any = None
        self.tokenizer: Any = None
        self.inflight = 0
        """Requests submitted and not yet finished (the router's load signal)."""
        self.served = 0
        self._inbox: queue.SimpleQueue[tuple[str, Any, Any, _Pending] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Build the engine (seconds to tens of seconds on CPU) and start its stepping thread."""
        if self.engine is not None:
            return
        for k, v in engine_env(self.opts).items():
            os.environ.setdefault(k, v)
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        from dreamgym.vllm_engine import freeze_import_garbage

        freeze_import_garbage()

        kw: dict[str, Any] = {}
        if self.opts.device == "cuda":
            kw["gpu_memory_utilization"] = self.opts.gpu_memory_utilization
        else:
            kw["kv_cache_memory_bytes"] = int(self.opts.kv_cache_gib * 2**30)
        from dreamgym.placement import vllm_parallel_kwargs

        kw.update(vllm_parallel_kwargs(self.opts.tensor_parallel_size))
        spec = speculative_config(self.opts.speculative_tokens)
        if spec is not None:
            kw["speculative_config"] = spec
        args = EngineArgs(
            model=self.opts.model, dtype=self.opts.dtype, max_model_len=self.opts.max_model_len,
            enable_prefix_caching=self.opts.prefix_caching, enforce_eager=self.opts.enforce_eager,
            seed=self.opts.seed, disable_log_stats=True, **kw,
        )
        self.engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        self.tokenizer = self.engine.get_tokenizer()
        self._thread = threading.Thread(target=self._run, name="dreamgym-vllm-step", daemon=True)
        self._thread.start()

    # -- the stepping thread (the only thread that touches the engine after start) -------------
    def _run(self) -> None:
        pending: dict[str, _Pending] = {}
        while True:
            items: list[tuple[str, Any, Any, _Pending] | None] = []
            try:  # block only when idle; then take everything that is waiting
                items.append(self._inbox.get(block=not pending))
                while True:
                    items.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            added = 0
            for item in items:
                if item is None:
                    continue
                rid, prompt, params, waiter = item
                try:
                    self.engine.add_request(rid, prompt, params)
                    pending[rid] = waiter
                    added += 1
                except Exception as e:  # a request the engine refuses fails alone
                    _resolve(waiter, Completion("", f"error:{type(e).__name__}: {e}"[:200],
                                                prompt_tokens=waiter.prompt_tokens))
            if None in items:  # shutdown
                _fail_all(pending, RuntimeError("the engine was shut down"))
                return
            if not pending:
                continue
            t0 = time.perf_counter()
            try:
                outputs = self.engine.step()
            except BaseException as e:  # the engine is broken: fail every waiter, refuse new work
                self._error = e
                _fail_all(pending, e)
                return
            self._book_step(pending, outputs, time.perf_counter() - t0, added)
            for out in outputs:
                if out.finished and out.request_id in pending:
                    w = pending.pop(out.request_id)
                    o = out.outputs[0]
                    _resolve(w, Completion(text=o.text, finish_reason=str(o.finish_reason or "stop"),
                                           prompt_tokens=w.prompt_tokens, completion_tokens=len(o.token_ids),
                                           cached_tokens=int(out.num_cached_tokens or 0), engine_steps=w.steps,
                                           engine_running=w.running, engine_waiting=w.waiting, engine_us=w.us,
                                           engine_prefill_steps=w.prefill_steps, engine_prefill_us=w.prefill_us))

    def _book_step(self, pending: dict[str, _Pending], outputs: list[Any], seconds: float, added: int) -> None:
        """Book one ``step()`` on one request it ran (the first one pending): how many requests ran, how many
        waited, how long it took, and whether requests had just arrived (``added``: the step computes their
        prompts). Summed over replies, these count every step once (``Completion.engine_steps``): the batch sizes
        the engine really ran, at the cost of a few integer additions per step."""
        finished = sum(1 for o in outputs if o.finished)
        counts = self._scheduler_counts()
        if counts is None:  # no scheduler to ask: every unfinished request counts as running
            running, waiting = len(pending), 0
        else:  # requests finished in this step have already left the scheduler's running list
            running, waiting = counts[0] + finished, counts[1]
        w = next(iter(pending.values()))
        w.steps += 1
        w.running += running
        w.waiting += waiting
        w.us += int(seconds * 1e6)
        if added:
            w.prefill_steps += 1
            w.prefill_us += int(seconds * 1e6)

    def _scheduler_counts(self) -> tuple[int, int] | None:
        """(running, waiting) requests of the in-process engine core's scheduler, or None where it is not reachable
        (a vLLM whose engine core runs elsewhere, or whose scheduler does not say)."""
        core = getattr(getattr(self.engine, "engine_core", None), "engine_core", None)
        counts = getattr(getattr(core, "scheduler", None), "get_request_counts", None)
        return None if counts is None else tuple(counts())  # type: ignore[return-value]

    # -- requests -------------------------------------------------------------------------------
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

        if self._error is not None:
            raise RuntimeError(f"the vLLM engine failed earlier: {self._error!r}")
        if len(prompt_ids) >= self.opts.max_model_len:
            return Completion("", f"error:prompt-too-long ({len(prompt_ids)} >= {self.opts.max_model_len} tokens)",
                              prompt_tokens=len(prompt_ids))
        loop = asyncio.get_running_loop()
        waiter = _Pending(loop.create_future(), loop, len(prompt_ids))
        self.inflight += 1
        try:
            self._inbox.put((uuid.uuid4().hex, TokensPrompt(prompt_token_ids=prompt_ids),
                             self.sampling_params(sampling, len(prompt_ids)), waiter))
            out = await waiter.future
        finally:
            self.inflight -= 1
        self.served += 1
        return out

    async def generate(self, request: CompletionRequest) -> Completion:
        return await self.generate_ids(self.render(request.messages), request.sampling)

    async def generate_batch(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    def shutdown(self) -> None:
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(timeout=30)
            self._thread = None
        if self.engine is not None:
            core = getattr(self.engine, "engine_core", None)
            if core is not None:
                core.shutdown()
            self.engine = None


def _resolve(w: _Pending, c: Completion) -> None:
    def set_result() -> None:
        if not w.future.done():
            w.future.set_result(c)

    w.loop.call_soon_threadsafe(set_result)


def _fail_all(pending: dict[str, _Pending], e: BaseException) -> None:
    for w in pending.values():
        w.loop.call_soon_threadsafe(_fail, w.future, e)
    pending.clear()


def _fail(fut: asyncio.Future[Completion], e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(RuntimeError(f"the vLLM engine failed: {e!r}"))


class InProcessClient(ExperienceClient):
    """An ``ExperienceClient`` over an ``AsyncEngine`` running on a background event-loop thread."""

    def __init__(self, opts: EngineOptions, timeout_s: float = 600.0) -> None:
        self.engine = AsyncEngine(opts)
        self.engine.start()
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dreamgym-vllm-loop", daemon=True)
        self._thread.start()

    def _call(self, coro: Any) -> Any:
        import concurrent.futures

        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            from dreamgym.experience.http_client import ExperienceBackendError

            raise ExperienceBackendError(
                f"the in-process vLLM engine did not answer a batch within {self.timeout_s:.0f} s; send smaller "
                "batches or raise experience_model.request_timeout_s"
            ) from None

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

        try:
            self.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()
