"""An in-process vLLM engine serving the policy: sampling with log-probs, scoring, in-place updates.

``VllmPolicy`` is plain Python (no Ray): the Ray actor ``actors.policy_engine.PolicyEngine`` wraps
it, and tests or scripts can use it directly. ``engine_env`` gives the environment variables an
engine needs *before* vLLM is imported (the actor passes them in its ``runtime_env``).

Settings that matter on CPU (see docs/stack-notes.md): the engine runs in the caller's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: faster start, less memory, tensors reach the worker
without pickling); the sampling seed is engine-wide (a per-request seed crashes the CPU sampler);
log-probs are the sampling distribution's (``logprobs_mode="processed_logprobs"``: after
temperature), so they are ``log pi_old`` of the GRPO ratio at the policy's temperature.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.agent_prompt import ACTION_STOP, ChatPromptBuilder, build_messages, parse_reply, turn_prompt
from dreamgym.errors import ConfigError
from dreamgym.types import ActionSample, AgentTurn

if TYPE_CHECKING:
    import torch

    from dreamgym.config import PolicyConfig

WORKER_EXTENSION = "dreamgym.vllm_worker.WeightUpdateExtension"


def engine_env(device: str = "cpu", omp_threads: int = 2, enforce_eager: bool = True) -> dict[str, str]:
    """Environment variables for a process that will own an in-process vLLM engine.

    An eager CPU engine (``engine.enforce_eager``, the default) also runs without TorchDynamo
    (``TORCHDYNAMO_DISABLE``): vLLM still wraps a few sampler ops in ``torch.compile`` (the rank of each sampled
    token's log-prob, the random sampling), and on CPU their first call compiles C++ with Inductor: about 3 s in
    every new engine process with a warm compile cache and 25 s with a cold one, for ops that cost microseconds
    eagerly."""
    from dreamgym.models import hub_env

    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        **hub_env(),  # the engine loads a local folder; a hub id was resolved (downloaded) into one first
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    }
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(omp_threads)
        if enforce_eager:
            env["TORCHDYNAMO_DISABLE"] = "1"
    return env


@functools.cache
def _unfreeze_at_exit() -> None:
    import atexit
    import gc

    atexit.register(gc.unfreeze)


def freeze_import_garbage() -> None:
    """Move every object alive now to the collector's permanent generation; call it right after importing vLLM.

    vLLM calls ``gc.collect()`` several times while an engine starts, and each call walks the million-odd objects
    its imports created: 2.5 s of a 4 s engine start on this 2-core machine. Frozen, those objects (modules,
    classes, functions, which live as long as the process anyway) are skipped; what the engine allocates later is
    collected as before. At exit they are unfrozen, so the interpreter's last collection still finalises them
    (extension modules such as nanobind report instances left alive then as leaks)."""
    import gc

    _unfreeze_at_exit()
    gc.freeze()


class VllmPolicy:
    """One vLLM engine holding the policy weights of one version."""

    def __init__(
        self,
        cfg: PolicyConfig,
        engine_index: int = 0,
        model_path: str | Path | None = None,
        weight_transfer_backend: str | None = None,
        sleep_mode: bool = False,
    ) -> None:
        for k, v in engine_env(cfg.engine.device, cfg.engine.omp_threads, cfg.engine.enforce_eager).items():
            os.environ.setdefault(k, v)
        from vllm import LLM

        from dreamgym.models import resolve_model

        freeze_import_garbage()

        self.cfg = cfg
        self.engine_index = engine_index
        self.transfer_backend = weight_transfer_backend
        """vLLM's weight-transfer backend (``nccl``, ``ipc``), or ``None``: weights arrive as tensors (object store)."""
        self._received: set[str] | None = None
        self.model_path = Path(model_path) if model_path else resolve_model(cfg.model)
        kwargs: dict[str, Any] = {}
        e = cfg.engine
        if e.device == "cuda":
            kwargs["gpu_memory_utilization"] = e.gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = int(e.kv_cache_gib * 2**30)
        from dreamgym.placement import vllm_parallel_kwargs

        kwargs.update(vllm_parallel_kwargs(e.tensor_parallel_size))
        if weight_transfer_backend:
            # vLLM's trainer-to-engine transfer (NCCL or CUDA IPC on GPU); the CPU path needs none.
            kwargs["weight_transfer_config"] = {"backend": weight_transfer_backend}
        if sleep_mode and e.device == "cuda":
            # vLLM's sleep mode (its CuMem allocator) frees the weights and KV cache while the colocated learner
            # steps (train.sleep_engines). A CPU engine has no sleep mode; its sleep still pauses the scheduler.
            kwargs["enable_sleep_mode"] = True
        from dreamgym.model_facts import context_problem, model_facts

        try:
            problem = context_problem("policy.engine", e.max_model_len, model_facts(self.model_path))
        except ValueError:
            problem = None  # a config.json without Llama-family sizes: vLLM checks the length itself
        if problem is not None:
            raise ConfigError(problem)  # vLLM's own refusal comes later, deep in its start-up
        self.dtype = e.resolved_dtype(self.model_path)
        """The concrete dtype served (``auto`` read from the checkpoint); weight syncs cast to it."""
        t0 = time.perf_counter()
        self.llm = LLM(
            model=str(self.model_path),
            dtype=self.dtype,
            seed=e.seed + engine_index,
            max_model_len=e.max_model_len,
            enforce_eager=e.enforce_eager,
            enable_prefix_caching=e.prefix_caching,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        self.start_seconds = time.perf_counter() - t0
        self.tokenizer = self.llm.get_tokenizer()
        self.weight_version = 0
        self.chat_restarts = 0
        """Chat conversations restarted with a fresh prompt because they outgrew ``engine.max_model_len``."""
        self.expected_shapes = checkpoint_shapes(self.model_path)
        """Checkpoint-format name -> shape of the served model; every update is checked against it."""
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        if self.tied_embeddings and "model.embed_tokens.weight" in self.expected_shapes:
            self.expected_shapes.setdefault("lm_head.weight", self.expected_shapes["model.embed_tokens.weight"])

    # -- prompts -----------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template applied to ``messages``, with the assistant header appended."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    @functools.cached_property
    def chat_builder(self) -> ChatPromptBuilder:
        return ChatPromptBuilder(self.tokenizer)

    def turn_prompt_ids(self, turn: AgentTurn) -> list[int]:
        """The prompt of ``turn`` (``policy.prompt_style``). ``chat``: the previous prompt + reply ids
        (``turn.context_token_ids``) extended by this step's short user turn; when that would not leave
        ``max_tokens`` within ``engine.max_model_len``, the conversation restarts with a fresh prompt showing the
        last ``chat_restart_steps`` steps (counted in ``chat_restarts``; the learner starts a new sequence there).
        ``windowed``, and the first step of a conversation: a fresh prompt (``fresh_prompt_ids``)."""
        c = self.cfg
        if c.prompt_style == "chat" and turn.context_token_ids:
            user = turn_prompt(turn, c.max_admissible_shown, c.observation_max_chars)
            ids = self.chat_builder.extend(turn.context_token_ids, user)
            if len(ids) <= c.engine.max_model_len - c.max_tokens:
                return ids
            self.chat_restarts += 1
            return self.fresh_prompt_ids(turn, c.chat_restart_steps)
        return self.fresh_prompt_ids(turn, c.history_steps)

    def fresh_prompt_ids(self, turn: AgentTurn, history: int) -> list[int]:
        """The full prompt of ``turn`` with the last ``history`` steps, shrunk to fit the engine's context
        (``engine.max_model_len`` less ``max_tokens``): a prompt too long (a long goal text, many valid actions)
        first drops its history, then halves the listed valid actions, then the observation, step by step. One
        that cannot fit even so is refused, naming sizes."""
        c = self.cfg
        budget = c.engine.max_model_len - c.max_tokens
        shown, chars = c.max_admissible_shown, c.observation_max_chars
        while True:
            ids = self.prompt_ids(build_messages(turn, c.reasoning, history, shown, chars, c.worked_example))
            if len(ids) <= budget:
                return ids
            if history:
                history = 0
            elif shown:
                shown //= 2
            elif chars > 64:
                chars //= 2
            else:
                raise ConfigError(
                    f"the policy prompt for task {turn.task.task_id!r} takes {len(ids)} tokens even with no history, "
                    f"no valid actions listed and the observation cut to {chars} characters, more than "
                    f"policy.engine.max_model_len ({c.engine.max_model_len}) less policy.max_tokens ({c.max_tokens}); "
                    "raise policy.engine.max_model_len (up to the model's context) or serve a longer-context model")

    # -- sampling ----------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = (ACTION_STOP,),
        parse: bool = True,
    ) -> list[list[ActionSample]]:
        """``n`` replies per prompt (token ids); each parsed into an action unless ``parse`` is False."""
        from vllm import SamplingParams

        c = self.cfg
        params = SamplingParams(
            n=n,
            max_tokens=max_tokens or c.max_tokens,
            temperature=c.temperature if temperature is None else temperature,
            top_p=c.top_p if top_p is None else top_p,
            logprobs=0,
            stop=list(stop) if stop else None,
            include_stop_str_in_output=True,
        )
        version = self.weight_version
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        result: list[list[ActionSample]] = []
        for prompt, out in zip(prompts, outs, strict=True):
            samples = []
            for comp in out.outputs:
                ids = list(comp.token_ids)
                lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs or [], strict=True)]
                parsed = parse_reply(comp.text) if parse else None
                samples.append(
                    ActionSample(
                        text=comp.text,
                        action=parsed.action if parsed else comp.text,
                        parsed=parsed.parsed if parsed else False,
                        prompt_token_ids=list(prompt),
                        token_ids=ids,
                        logprobs=lps,
                        weight_version=version,
                        finish_reason=str(comp.finish_reason or ""),
                    )
                )
            result.append(samples)
        return result

    def act(self, turns: Sequence[AgentTurn], n: int = 1, **kw: Any) -> list[list[ActionSample]]:
        """Sample ``n`` actions for each agent turn (a GRPO group member each)."""
        return self.generate([self.turn_prompt_ids(t) for t in turns], n=n, **kw)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """``log p(x_j | x_<j)`` for ``j >= 1`` of each token sequence, at temperature 1 (teacher forcing)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        outs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)
        result = []
        for seq, out in zip(sequences, outs, strict=True):
            plp = out.prompt_logprobs or []
            result.append([float(plp[j][seq[j]].logprob) for j in range(1, len(seq))])
        return result

    # -- weights -----------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor], version: int) -> dict:
        """Load a full set of new weights (HF names, any dtype) in place, reset the prefix cache, set ``version``.

        The set is checked against the served checkpoint's names and shapes first: a wrong set raises
        ``ValueError`` and leaves the engine serving its current weights (a reload that fails half-way
        would leave layers unmaterialised). With tied embeddings the LM head is sent explicitly as the
        embedding: on CPU vLLM serves the head from a pre-packed copy that is only rebuilt when
        ``lm_head.weight`` itself is loaded (weight-update trap 2 in docs/stack-notes.md).
        """
        pairs = self.check_weights(weights)
        t0 = time.perf_counter()
        summary = self.llm.collective_rpc("dg_load_weights", args=(pairs,))[0]
        self.llm.reset_prefix_cache()
        self.weight_version = int(version)
        return {**summary, "version": self.weight_version, "seconds": time.perf_counter() - t0}

    def check_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]
                      ) -> list[tuple[str, torch.Tensor]]:
        """A full set as ``load_weights`` takes it (names and shapes checked; ``ValueError`` if it does not fit)."""
        return self._checked(list(weights.items()) if isinstance(weights, dict) else list(weights))

    # -- weights in steps: vLLM's weight-transfer protocol (start, one update per chunk, finish) ------------
    # Between ``start_update`` and ``finish_update`` the model is half-loaded: the caller must keep generation
    # away (``dreamgym.weight_gate``; the engine actor does).
    def start_update(self) -> None:
        """Begin an update: vLLM's ``start_weight_update`` (NCCL), or a layerwise reload (object store)."""
        self.llm.collective_rpc("start_weight_update" if self.transfer_backend else "dg_start_reload")
        self._received = set()

    def update_chunk(self, update_info: Any) -> int:
        """One chunk of the update begun by ``start_update``: vLLM's ``update_weights`` with the backend's update
        info (NCCL: names, dtypes and shapes of the broadcast that runs meanwhile), or, without a transfer backend,
        ``(HF name, tensor)`` pairs (a dict or a list), checked against the served checkpoint. Returns the
        number of tensors."""
        if self._received is None:
            raise RuntimeError("update_chunk without start_update")
        if self.transfer_backend:
            self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})
            names = list(update_info.get("names", [])) if isinstance(update_info, dict) else []
        else:
            pairs = self._checked(list(update_info.items()) if isinstance(update_info, dict) else list(update_info),
                                  partial=True)
            self.llm.collective_rpc("dg_load_chunk", args=(pairs,))
            names = [n for n, _ in pairs]
        self._received.update(names)
        return len(names)

    def finish_update(self, version: int | None) -> dict:
        """Finish the update (vLLM's ``finish_weight_update``, or the reload's), re-tie a tied head, reset the
        prefix cache and serve ``version``. Without a transfer backend, a set that missed tensors of the
        checkpoint raises ``ValueError`` (the layers it did not cover kept their old values)."""
        if self._received is None:
            raise RuntimeError("finish_update without start_update")
        received, self._received = self._received, None
        if self.transfer_backend:
            self.llm.collective_rpc("finish_weight_update")
            retied = bool(self.llm.collective_rpc("dg_retie")[0])
        else:
            retied = bool(self.llm.collective_rpc("dg_finish_reload")[0])
        self.llm.reset_prefix_cache()
        if not self.transfer_backend:
            missing = sorted(set(self.expected_shapes) - received - ({"lm_head.weight"} if self.tied_embeddings
                                                                     else set()))
            if missing:
                raise ValueError(f"the update of {self.model_path.name} missed {len(missing)} tensor(s) of the "
                                 f"checkpoint, e.g. {missing[:5]}: their layers kept the old weights")
        if version is not None:
            self.weight_version = int(version)
        return {"version": self.weight_version, "retied": retied, "tensors": len(received)}

    def param_checksum(self, name: str = "model.embed_tokens.weight") -> float:
        return float(self.llm.collective_rpc("dg_param_checksum", args=(name,))[0])

    def _checked(self, pairs: list[tuple[str, torch.Tensor]], partial: bool = False) -> list[tuple[str, torch.Tensor]]:
        """``pairs`` with a tied head added, if they match the served checkpoint (names and shapes; all of its
        tensors unless ``partial``, one chunk of an update); else ``ValueError`` naming what differs."""
        expected = self.expected_shapes
        names = {n for n, _ in pairs}
        if self.tied_embeddings and "lm_head.weight" not in names:
            embed = dict(pairs).get("model.embed_tokens.weight")
            if embed is not None:
                pairs = [*pairs, ("lm_head.weight", embed)]
                names.add("lm_head.weight")
        unknown = sorted(names - set(expected))
        missing = [] if partial else sorted(set(expected) - names - ({"lm_head.weight"} if self.tied_embeddings
                                                                     else set()))
        wrong = [f"{n} {tuple(t.shape)} != {expected[n]}" for n, t in pairs if n in expected
                 and tuple(t.shape) != expected[n]]
        if unknown or missing or wrong:
            raise ValueError(
                f"weights do not match the served model {self.model_path.name}: unknown {unknown[:5]}, "
                f"missing {missing[:5]}, wrong shapes {wrong[:5]}"
            )
        return pairs


def checkpoint_shapes(model_path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of an HF safetensors checkpoint (headers only; no weights are read)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                shapes[k] = tuple(st.get_slice(k).get_shape())
    return shapes
