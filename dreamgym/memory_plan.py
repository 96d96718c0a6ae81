"""GPU memory of a ``dreamgym train`` layout, estimated per GPU before anything starts (``train --dry-run``).

No Ray, no torch, no weights: parameter counts and KV-cache sizes come from each model's ``config.json``
(``dreamgym.model_facts``), GPUs from the placement plan (``dreamgym.placement``). The figures:

- A learner rank holds fp32 weights (4 bytes per parameter; bf16 autocast keeps fp32 master weights), fp32
  gradients (4) and AdamW's two fp32 moments (8) of its trainable parameters (all, or the LoRA adapters), a frozen
  fp32 reference copy when ``learner.kl_coef`` > 0 (no LoRA), a PPO critic with its own gradients and AdamW, the
  engine-dtype copy of the weights built for each NCCL sync, and a CUDA context (``CUDA_CONTEXT_GIB``).
  Activations are not counted: they depend on ``learner.micro_batch_tokens`` and gradient checkpointing, so a plan
  that fits with little to spare may still run out of memory in the first step.
- A CUDA vLLM engine takes ``gpu_memory_utilization`` x the GPU's memory on each of its GPUs, whatever else is
  there: its weights (split over ``tensor_parallel_size``), ``ENGINE_RESERVE_GIB`` for the CUDA context and the
  profiling pass's activations, and the rest as KV cache, which must hold at least one ``max_model_len`` sequence.
- Fractional GPU requests are packed first-fit onto GPUs (Ray packs fractions onto one GPU before the next), the
  worst case for memory; whole-GPU requests take GPUs of their own.

A GPU whose holdings add up to more than its memory refuses the plan, with the sum in the message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dreamgym.dtypes import DTYPE_BYTES, engine_dtype
from dreamgym.model_facts import ModelFacts, context_problem, model_facts

if TYPE_CHECKING:
    from dreamgym.config import DreamGymConfig, EngineConfig, LearnerConfig
    from dreamgym.placement import ActorPlan, PlacementPlan

GIB = float(2**30)
#: Per process holding a CUDA device outside vLLM's budget: the CUDA context and the allocator's slack (estimate).
CUDA_CONTEXT_GIB = 0.5
#: Inside a vLLM engine's budget and besides its weights: CUDA context and the profiling pass's activations
#: (estimate; CUDA graphs, with ``enforce_eager`` off, take a few hundred MiB more).
ENGINE_RESERVE_GIB = 1.0
#: The GPU memory ``train --dry-run`` assumes per GPU unless told (``--gpu-memory-gib``): an 80 GB H100/A100.
DEFAULT_GPU_GIB = 79.6

FactsFor = Callable[[str], ModelFacts]


@dataclass(frozen=True)
class Holding:
    """What one actor holds on one GPU."""

    actor: str
    gib: float
    detail: str


@dataclass
class GpuMemory:
    """One GPU and what the plan puts on it."""

    index: int
    share: float = 0.0
    """Ray GPU units taken (1.0: the GPU is reserved whole)."""
    holdings: list[Holding] = field(default_factory=list)

    @property
    def gib(self) -> float:
        return sum(h.gib for h in self.holdings)


@dataclass
class MemoryPlan:
    """The estimated memory of every GPU of a layout, and what could not be planned."""

    gpu_gib: float
    gpus: list[GpuMemory] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    """Problems of one role on its own (a context too long, weights beyond an engine's budget)."""
    not_planned: list[str] = field(default_factory=list)
    """Roles left out (a model's ``config.json`` unavailable, no GPU left in the stated shape)."""

    def problems(self) -> list[str]:
        """Why the layout does not fit (empty: it fits), each with its arithmetic."""
        out = list(self.issues)
        for g in self.gpus:
            if g.gib > self.gpu_gib + 1e-9:
                parts = " + ".join(f"{h.actor} {h.gib:.1f}" for h in g.holdings)
                out.append(f"GPU {g.index} holds {parts} = {g.gib:.1f} GiB, more than its {self.gpu_gib:g} GiB")
        return out

    def table(self) -> str:
        """Per GPU: what it holds, with the breakdown, and the total against the GPU's memory."""
        lines = [f"memory per GPU (estimated, {self.gpu_gib:g} GiB each; learner activations not counted):"]
        for g in self.gpus:
            mark = "" if g.gib <= self.gpu_gib + 1e-9 else "  DOES NOT FIT"
            lines.append(f"GPU {g.index}: {g.gib:.1f} / {self.gpu_gib:g} GiB{mark}")
            lines += [f"  {h.actor}: {h.gib:.1f} GiB ({h.detail})" for h in g.holdings]
        lines += [f"not planned: {n}" for n in self.not_planned]
        return "\n".join(lines)


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


def lora_params(facts: ModelFacts, target_modules: list[str], r: int) -> int:
    """Trainable parameters of LoRA adapters of rank ``r`` on ``target_modules`` of every layer."""
    h, q, kv, inter = facts.hidden_size, facts.num_heads * facts.head_dim, facts.num_kv_heads * facts.head_dim, \
        facts.intermediate_size
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}
    return facts.num_layers * sum(r * (a + b) for m, (a, b) in dims.items() if m in target_modules)


def learner_holding(le: LearnerConfig, facts: ModelFacts, sync_dtype: str | None,
                    critic: ModelFacts | None = None) -> tuple[float, str]:
    """GiB one learner rank holds on its GPU and the breakdown; ``sync_dtype``: the engines' dtype when the rank
    builds a copy for an NCCL sync (``None`` otherwise)."""
    p = facts.params
    trainable = lora_params(facts, le.lora.target_modules, le.lora.r) if le.lora.enabled else p
    parts = [("weights fp32", 4 * p), ("gradients fp32", 4 * trainable), ("AdamW fp32", 8 * trainable)]
    if le.kl_coef > 0 and not le.lora.enabled:
        parts.append(("reference fp32", 4 * p))
    if critic is not None:
        parts.append(("PPO critic weights+grads+AdamW", 16 * critic.params))
    if sync_dtype is not None:
        parts.append((f"{sync_dtype} sync copy", DTYPE_BYTES[sync_dtype] * p))
    gib = sum(_gib(b) for _, b in parts) + CUDA_CONTEXT_GIB
    what = ", ".join(f"{n} {_gib(b):.1f}" for n, b in parts)
    return gib, f"{_count(facts.params)} params{' (LoRA)' if le.lora.enabled else ''}: {what}, " \
                f"CUDA context {CUDA_CONTEXT_GIB:g}"


def experience_sft_holding(cfg: DreamGymConfig, facts: ModelFacts) -> tuple[float, str]:
    """GiB one rank of the experience-model fine-tune (``train.experience_sft``) holds: the learner's arithmetic
    for the experience model's base with the fine-tune's method (full, or LoRA of rank ``lora_r`` on the
    adapters' default modules, as ``learner.sft_experience`` builds them) and no reference copy."""
    from dreamgym.config import LearnerConfig, LoraConfig

    t = cfg.experience_model.train
    le = LearnerConfig(lora=LoraConfig(enabled=t.method == "lora", r=t.lora_r), kl_coef=0.0)
    return learner_holding(le, facts, None)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def engine_holding(where: str, e: EngineConfig, facts: ModelFacts, gpu_gib: float) -> tuple[float, str, list[str]]:
    """GiB a CUDA engine takes on each of its GPUs, the breakdown, and its own problems (weights beyond its budget,
    no room for one ``max_model_len`` sequence of KV cache, a context beyond the model's)."""
    dtype = engine_dtype(facts.dtype if e.dtype == "auto" else e.dtype, e.device, None)
    tp = e.tensor_parallel_size
    budget = e.gpu_memory_utilization * gpu_gib
    weights = _gib(facts.params * DTYPE_BYTES[dtype]) / tp
    kv = budget - weights - ENGINE_RESERVE_GIB
    one_seq = _gib(facts.kv_bytes_per_token(DTYPE_BYTES[dtype]) * e.max_model_len) / tp
    problems = []
    if kv < one_seq:
        problems.append(
            f"{where}: gpu_memory_utilization {e.gpu_memory_utilization:g} x {gpu_gib:g} GiB = {budget:.1f} GiB, less "
            f"the {dtype} weights {weights:.1f} GiB{f' (1/{tp})' if tp > 1 else ''} and {ENGINE_RESERVE_GIB:g} GiB "
            f"reserve, leaves {kv:.2f} GiB of KV cache, less than one sequence of max_model_len {e.max_model_len} "
            f"({one_seq:.2f} GiB); raise {where}.gpu_memory_utilization or tensor_parallel_size, or lower "
            f"{where}.max_model_len")
    if (p := context_problem(where, e.max_model_len, facts)) is not None:
        problems.append(p)
    detail = (f"gpu_memory_utilization {e.gpu_memory_utilization:g} x {gpu_gib:g}: {dtype} weights {weights:.1f}, "
              f"reserve {ENGINE_RESERVE_GIB:g}, KV cache {max(kv, 0.0):.1f} = "
              f"{max(kv, 0.0) / one_seq if one_seq > 0 else 0:.0f} sequences of {e.max_model_len} tokens")
    return budget, detail, problems


def engine_roles(cfg: DreamGymConfig | Any, plan: PlacementPlan | None = None) -> list[tuple[str, str, EngineConfig]]:
    """``(config path of the engine, model, engine config)`` of every engine role ``cfg`` serves: a run config's
    policy engines and (where the plan has them) experience replicas; a ``PolicyConfig`` or ``ExperienceModelConfig``
    on its own (what a GPU test builds) its one engine; nothing for other sections."""
    from dreamgym.config import DreamGymConfig, ExperienceModelConfig, PolicyConfig

    if isinstance(cfg, DreamGymConfig):
        roles = [("policy.engine", cfg.policy.model, cfg.policy.engine)]
        if plan is None or plan.role("experience-replica"):
            em = cfg.experience_model
            if em.backend != "http" and (plan is not None or em.engine.device == "cuda"):
                roles.append(("experience_model.engine", em.model, em.engine))
        return roles
    if isinstance(cfg, PolicyConfig):
        return [("policy.engine", cfg.model, cfg.engine)]
    if isinstance(cfg, ExperienceModelConfig):
        return [("experience_model.engine", cfg.model, cfg.engine)]
    return []


def context_problems(cfg: DreamGymConfig | Any, facts_for: FactsFor = model_facts) -> list[str]:
    """Every engine of ``cfg`` (``engine_roles``) whose ``max_model_len`` its model cannot serve."""
    out = []
    for where, model, e in engine_roles(cfg):
        if (p := context_problem(where, e.max_model_len, facts_for(model))) is not None:
            out.append(p)
    return out


def _slots(plan: PlacementPlan) -> list[tuple[ActorPlan, float, int]]:
    """``(actor, GPU share, tensor-parallel rank)`` for every GPU an actor (or its TP workers) uses."""
    out = []
    for a in plan.actors:
        if a.tensor_parallel_size > 1:
            out += [(a, 1.0, r) for r in range(a.tensor_parallel_size)]
        elif a.gpus > 0:
            out += [(a, 1.0, 0)] * int(a.gpus) if a.gpus >= 1 else [(a, a.gpus, 0)]
    return out


def plan_memory(cfg: DreamGymConfig, plan: PlacementPlan, gpus: int, gpu_gib: float = DEFAULT_GPU_GIB,
                facts_for: FactsFor = model_facts) -> MemoryPlan:
    """The memory plan of ``cfg`` laid out as ``plan`` on ``gpus`` GPUs of ``gpu_gib`` GiB each."""
    from dreamgym.sync_choice import weight_sync_of

    mem = MemoryPlan(gpu_gib, [GpuMemory(i) for i in range(max(gpus, 0))])
    facts: dict[str, ModelFacts | None] = {}

    def known(model: str) -> ModelFacts | None:
        if model not in facts:
            try:
                facts[model] = facts_for(model)
            except ValueError as e:
                facts[model] = None
                mem.not_planned.append(str(e))
        return facts[model]

    le, pe = cfg.learner, cfg.policy.engine
    nccl = weight_sync_of(cfg) == "nccl"
    em = cfg.experience_model
    engines = {"policy-engine": ("policy.engine", cfg.policy.model, pe),
               "experience-replica": ("experience_model.engine", em.model, em.engine)}
    done: set[str] = set()
    for actor, share, tp_rank in _slots(plan):
        if actor.role == "learner":
            f = known(le.model or cfg.policy.model)
            if f is None:
                continue
            critic = known(le.critic_model or le.model or cfg.policy.model) if le.algorithm == "ppo" else None
            sync = engine_dtype(f.dtype if pe.dtype == "auto" else pe.dtype, pe.device, None) \
                if nccl and actor.index == 0 else None
            gib, detail = learner_holding(le, f, sync, critic)
        elif actor.role == "experience-sft":
            f = known(em.train.base)
            if f is None:
                continue
            gib, detail = experience_sft_holding(cfg, f)
        elif actor.role in engines:
            where, model, e = engines[actor.role]
            f = known(model)
            if f is None:
                continue
            gib, detail, issues = engine_holding(where, e, f, gpu_gib)
            if where not in done:
                done.add(where)
                mem.issues += issues
        else:
            continue
        name = actor.name + (f" (TP rank {tp_rank})" if actor.tensor_parallel_size > 1 else "")
        gpu = _place(mem.gpus, share)
        if gpu is None:
            mem.not_planned.append(f"{name}: no GPU left of the {gpus} stated")
            continue
        gpu.share += share
        gpu.holdings.append(Holding(name, gib, detail))
    return mem


def _place(gpus: list[GpuMemory], share: float) -> GpuMemory | None:
    """The GPU a request of ``share`` GPU units lands on: a free one for a whole GPU, else first fit."""
    for g in gpus:
        if (share >= 1.0 and g.share == 0.0) or (share < 1.0 and g.share + share <= 1.0 + 1e-9):
            return g
    return None


def gpu_count(plan: PlacementPlan) -> int:
    """GPUs the plan needs at least (whole requests, and fractions rounded up)."""
    return math.ceil(plan.total_gpus - 1e-9)
