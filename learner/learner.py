"""The learner: one ``step(groups)`` = advantages, micro-batched backward, one or more AdamW steps.

``learner.algorithm`` picks the advantages: ``grpo`` (group-relative, ``dreamgym/grpo.py``) or ``ppo``
(a critic and turn-level GAE, ``dreamgym/ppo.py``, the critic in ``learner.critic``). Both share the
clipped policy loss, the KL options, the aggregation modes, the mini-/micro-batching below and the
engine/learner mismatch metrics and optional TIS correction (``learner.tis``).

Buildable and steppable without Ray: ``Learner(cfg.learner, model_path, seed=...)`` in any process.
The loss is ``dreamgym.grpo.policy_loss`` (its docstring states the exact GRPO variant); the
sequences and masks come from ``learner.sequences``. ``save_checkpoint`` / ``from_checkpoint`` decide
what a checkpoint holds; ``learner.checkpoint`` is its file format.

One call of ``step`` is one *learner step*: it bumps the weight version by one (when it updated
anything), after which the caller pushes ``sync_weights()`` to the engines. Inside a step the batch
is split into ``mini_batches`` parts, each one AdamW step with gradients accumulated over
micro-batches of at most ``micro_batch_tokens`` padded tokens.

Data parallel (config ``learner.data_parallel`` = N > 1; module ``learner.data_parallel``): the process
is one of N ranks of an initialised ``torch.distributed`` group; every rank builds the whole batch, runs
forward/backward on its share of each mini-batch's sequences and the gradients are summed over the ranks
before clipping, so the step (and its metrics) equal the single-process step on the whole batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.grpo import engine_gap, policy_loss, tis_weights
from dreamgym.hardware import native_bf16
from dreamgym.types import Group, WeightVersion
from learner import checkpoint
from learner import data_parallel as dp
from learner.batching import collate, micro_batches, prefix_micro_batches
from learner.model import add_lora, is_peft, load_causal_lm, shard_fsdp, sync_weights, token_logprobs
from learner.sequences import TokenSequence, assign_weights, build_batch, build_ppo_batch
from learner.shared_prefix import prefix_token_logprobs, unsupported

if TYPE_CHECKING:
    import torch

    from dreamgym.config import DreamGymConfig, LearnerConfig
    from learner.critic import Critic


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}")


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("learner.device is 'cuda' but no CUDA GPU is visible")
    return device


class Learner:
    """GRPO or PPO on a causal LM. ``model_path``: initial weights (HF folder); ``temperature``: the policy's."""

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str | Path,
        *,
        seed: int = 0,
        temperature: float = 1.0,
        reference_path: str | Path | None = None,
    ) -> None:
        import torch

        self.cfg = cfg
        self.model_path = Path(model_path)
        self.reference_path = Path(reference_path) if reference_path else self.model_path
        self.temperature = temperature
        self.seed = seed
        self.device = pick_device(cfg.device)
        self.bf16 = cfg.precision == "bf16-autocast" or (cfg.precision == "auto" and native_bf16(self.device))
        """Matmuls in bf16 autocast (``learner.precision``; ``auto``: where bf16 is native)."""
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        """Shuffles samples into mini-batches (checkpointed)."""

        model = load_causal_lm(self.model_path, self.device)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if cfg.lora.enabled:
            model = add_lora(model, cfg.lora)
        if cfg.fsdp:
            model = shard_fsdp(model)
        self.rank, self.world_size = dp.world()
        if cfg.data_parallel > 1:
            if self.world_size != cfg.data_parallel:
                raise RuntimeError(f"learner.data_parallel is {cfg.data_parallel} but this process is rank "
                                   f"{self.rank} of a group of {self.world_size}: join the group first "
                                   "(learner.data_parallel.init_group)")
            # Same folder and seed give equal replicas already; this makes it a guarantee (LoRA init, GPUs).
            dp.broadcast_params(model)
        self.model = model
        self.reference: torch.nn.Module | None = None
        if cfg.kl_coef > 0.0 and not cfg.lora.enabled:
            self.reference = load_causal_lm(self.reference_path, self.device).eval().requires_grad_(False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, cfg.warmup_steps, cfg.total_steps, cfg.schedule, cfg.min_lr_ratio),
        )
        self.optimizer_steps = 0
        self.version = WeightVersion(version=0, step=0)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(self.model_path), local_files_only=True)
        self.tokenizer = tok
        """Held for the checkpoints: ``model_path`` may be a checkpoint that rotation deletes later in the run."""
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.critic: Critic | None = None
        self._critic_seconds = 0.0
        if cfg.algorithm == "ppo":
            self.critic = self._build_critic()

    def _build_critic(self) -> Critic:
        """The PPO critic: ``critic_model`` or a copy of the policy's initial weights (the base model with LoRA)."""
        from dreamgym.models import resolve_model
        from learner.critic import Critic

        c = self.cfg
        path = resolve_model(c.critic_model) if c.critic_model else self.model_path
        inner = self.model.get_base_model() if is_peft(self.model) else self.model
        return Critic(
            c, path, self.device,
            lambda s: lr_factor(s, c.warmup_steps, c.total_steps, c.schedule, c.min_lr_ratio),
            self._autocast, vocab_size=int(inner.config.vocab_size),
        )

    @classmethod
    def from_config(cls, cfg: DreamGymConfig) -> Learner:
        """The learner of a run: initial weights ``learner.model`` (default ``policy.model``), seed
        ``run.seed``, log-probs at ``policy.temperature``."""
        from dreamgym.models import resolve_model

        path = resolve_model(cfg.learner.model or cfg.policy.model)
        return cls(cfg.learner, path, seed=cfg.run.seed, temperature=cfg.policy.temperature)

    # -- forward helpers -----------------------------------------------------------------------------
    def _autocast(self) -> Any:
        import torch

        if self.bf16:
            return torch.autocast(device_type=self.device, dtype=torch.bfloat16)
        return nullcontext()

    def _token_logprobs(self, model: torch.nn.Module, mb: Any, temperature: float,
                        needed: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """``token_logprobs`` of micro-batch ``mb`` and the token positions run: with ``learner.shared_prefix``
        the rows' common prefix runs once (``learner.shared_prefix``), else every row's tokens."""
        if not self.cfg.shared_prefix:
            return token_logprobs(model, mb.input_ids, mb.attention_mask, temperature, needed), mb.num_tokens
        out = prefix_token_logprobs(model, mb.input_ids, mb.attention_mask, temperature, needed)
        return out.logprobs, out.forwarded_tokens

    def _micro_batches(self, seqs: Sequence[TokenSequence]) -> list[list[int]]:
        """Micro-batches of ``seqs`` within ``micro_batch_tokens``; when the forward shares prefixes
        (``learner.shared_prefix`` on and supported by the model as it is now), grouped by shared prefix and
        budgeted with each micro-batch's prefix counted once (``prefix_micro_batches``)."""
        if self.cfg.shared_prefix and unsupported(self.model) is None:
            return prefix_micro_batches([s.input_ids for s in seqs], self.cfg.micro_batch_tokens)
        return micro_batches([len(s) for s in seqs], self.cfg.micro_batch_tokens)

    def _reference_logprobs(self, mb: Any) -> torch.Tensor | None:
        import torch

        if self.cfg.kl_coef <= 0.0:
            return None
        with torch.no_grad(), self._autocast():
            if is_peft(self.model):
                with self.model.disable_adapter():
                    return self._token_logprobs(self.model, mb, self.temperature, mb.mask)[0]
            assert self.reference is not None
            return self._token_logprobs(self.reference, mb, self.temperature, mb.mask)[0]

    def sequence_logprobs(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        """Teacher-forced ``log p(x_j | x_<j)``, ``j >= 1``, of each token sequence (no grad, eval mode)."""
        import torch

        seqs = [TokenSequence(input_ids=list(s), loss_mask=[False] * len(s), behaviour_logprobs=[0.0] * len(s))
                for s in sequences]
        out: list[list[float]] = [[] for _ in seqs]
        was_training = self.model.training
        self.model.eval()
        try:
            for idx in self._micro_batches(seqs):
                mb = collate(seqs, idx, self.pad_id, self.device)
                with torch.no_grad(), self._autocast():
                    lp = self._token_logprobs(self.model, mb, temperature)[0]
                for row, i in enumerate(idx):
                    out[i] = lp[row, : len(seqs[i]) - 1].tolist()
        finally:
            self.model.train(was_training)
        return out

    # -- the step --------------------------------------------------------------------------------------
    def step(self, groups: Sequence[Group]) -> dict[str, float]:
        """One learner step on ``groups`` (GRPO or PPO by ``learner.algorithm``); returns metrics.

        Always: ``groups``, ``degenerate_groups`` (GRPO: dropped, all rewards equal; PPO drops none),
        ``reward_mean`` (over every trajectory), ``samples`` / ``sequences`` / ``policy_tokens`` (what was
        trained on). When nothing carries signal the step is skipped (``skipped = 1``, version unchanged).
        Otherwise also ``loss``, ``grad_norm`` (before clipping, mean over mini-batches), ``lr``,
        ``clip_frac``, ``ratio_mean``, ``kl_old`` / ``kl_ref`` (per policy token), ``engine_kl_mean`` /
        ``engine_kl_max`` (the engine/learner gap: k3 estimate of ``KL(engine || learner)`` per policy token
        that has engine log-probs, over ``engine_tokens`` tokens), with ``learner.tis`` ``tis_weight_mean``
        and ``tis_capped_frac``, ``optimizer_steps``, ``version``, ``processed_tokens`` (the token positions
        the policy ran forward and backward: no padding, and a micro-batch's shared prefix once with
        ``learner.shared_prefix``), ``seconds`` and ``tokens_per_s``. PPO adds the critic's metrics
        (``_ppo_step``).
        """
        if self.cfg.algorithm == "ppo":
            return self._ppo_step(groups)
        t0 = time.perf_counter()
        c = self.cfg
        batch = build_batch(groups, c.scale_by_std, c.adv_eps, c.loss_agg, c.max_response_tokens)
        metrics = self._batch_metrics(groups, batch, float(batch.advantages.degenerate), t0)
        if metrics.get("skipped"):
            return metrics
        return self._update(batch.sequences, metrics, t0)

    def _batch_metrics(self, groups: Sequence[Group], batch: Any, degenerate: float, t0: float) -> dict[str, float]:
        """The step's batch facts (GRPO and PPO alike); a batch with no policy token is a skipped step."""
        rewards = batch.rewards
        metrics: dict[str, float] = {
            "groups": float(len(groups)),
            "degenerate_groups": degenerate,
            "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "samples": float(batch.num_samples),
            "sequences": float(len(batch.sequences)),
            "policy_tokens": float(sum(s.num_policy_tokens for s in batch.sequences)),
        }
        if not batch.sequences or metrics["policy_tokens"] == 0:
            metrics.update(skipped=1.0, version=float(self.version.version), seconds=time.perf_counter() - t0)
        return metrics

    def _ppo_step(self, groups: Sequence[Group]) -> dict[str, float]:
        """One PPO step: critic values before the step, turn-level GAE, then the shared update loop with
        a critic step beside each policy step (only the critic during ``critic_warmup_steps``).

        PPO metrics on top of ``step``'s: ``turns``, ``adv_mean`` / ``adv_std`` (raw GAE, before whitening),
        ``return_mean``, ``value_mean``, ``explained_variance`` (of the values before the step),
        ``value_loss`` (mean over mini-batches), ``value_mse``, ``value_clip_frac``, ``critic_grad_norm``,
        ``critic_warmup`` (1 while only the critic trains), ``critic_seconds`` and ``critic_share`` (of the
        step's time).
        """
        t0 = time.perf_counter()
        c = self.cfg
        critic = self.critic
        assert critic is not None
        batch = build_ppo_batch(groups, c.loss_agg, c.max_response_tokens)
        metrics = self._batch_metrics(groups, batch, 0.0, t0)  # PPO drops nothing: the critic is the baseline
        if metrics.get("skipped"):
            return metrics
        from learner.critic import assign_targets

        tc = time.perf_counter()
        values = critic.turn_values(batch.sequences, self.pad_id)
        metrics.update(assign_targets(batch, values, c.gamma, c.gae_lambda, c.norm_adv, c.adv_eps))
        self._critic_seconds = time.perf_counter() - tc
        warmup = critic.steps < c.critic_warmup_steps
        metrics["critic_warmup"] = float(warmup)
        out = self._update(batch.sequences, metrics, t0, train_policy=not warmup)
        critic.steps += 1
        out["critic_seconds"] = self._critic_seconds
        out["critic_share"] = self._critic_seconds / max(out["seconds"], 1e-9)
        return out

    def _update(
        self, sequences: list[TokenSequence], metrics: dict[str, float], t0: float, train_policy: bool = True
    ) -> dict[str, float]:
        """The mini-batch loop shared by GRPO and PPO: per mini-batch one policy AdamW step (unless
        ``train_policy`` is False: PPO's critic warm-up) and, with PPO, one critic step."""
        import torch

        c = self.cfg
        # Mini-batches are drawn (and their ``w_t`` set) on the whole batch, identically on every rank; each
        # rank then keeps its share. ``pi_old`` is needed only for the sequences this rank trains on.
        parts = [self._my_share(part) for part in self._mini_batches(sequences)]
        old_logprobs = self._old_logprobs([s for part in parts for s in part]) if train_policy else None
        sums = {"loss": 0.0, "tokens": 0.0, "clipped": 0.0, "ratio": 0.0, "kl_old": 0.0, "kl_ref": 0.0,
                "gap_sum": 0.0, "gap_tokens": 0.0, "tis_sum": 0.0, "tis_capped": 0.0}
        gap_max = 0.0
        critic_sums: dict[str, float] = {}
        grad_norms: list[float] = []
        critic_norms: list[float] = []
        processed_tokens = 0
        for part in parts:
            if train_policy:
                self.optimizer.zero_grad(set_to_none=True)
                for idx in self._micro_batches(part):
                    mb = collate(part, idx, self.pad_id, self.device)
                    ref = self._reference_logprobs(mb)
                    with self._autocast():
                        logp, forwarded = self._token_logprobs(self.model, mb, self.temperature, mb.mask)
                    if old_logprobs is None:
                        learner_old = logp.detach()
                    else:
                        learner_old = self._gather_old(old_logprobs, part, idx, logp.shape)
                    old = mb.behaviour_logprobs if c.behaviour_logprobs == "engine" else learner_old
                    engine_mask = mb.mask & mb.engine_rows[:, None] if mb.engine_rows is not None else mb.mask
                    g_sum, g_max, g_n = engine_gap(learner_old, mb.behaviour_logprobs, engine_mask)
                    sums["gap_sum"] += g_sum
                    sums["gap_tokens"] += g_n
                    gap_max = max(gap_max, g_max)
                    weights = mb.weights
                    if c.tis:
                        raw = tis_weights(learner_old, mb.behaviour_logprobs, float("inf"))
                        tis = torch.where(engine_mask, raw.clamp(max=c.tis_cap), torch.ones_like(raw))
                        weights = weights * tis
                        sums["tis_sum"] += float((tis * mb.mask).sum())
                        sums["tis_capped"] += float(((raw > c.tis_cap) & engine_mask).sum())
                    terms = policy_loss(
                        logp, old, mb.advantages, weights, mb.mask, c.clip_low, c.clip_high, ref, c.kl_coef
                    )
                    terms.loss.backward()
                    processed_tokens += forwarded
                    sums["loss"] += float(terms.loss.detach())
                    sums["tokens"] += terms.tokens
                    sums["clipped"] += terms.clipped
                    sums["ratio"] += terms.ratio_sum
                    sums["kl_old"] += terms.kl_old_sum
                    sums["kl_ref"] += terms.kl_ref_sum
                if self.data_parallel:
                    dp.all_reduce_grads(self.params)  # sum: each rank's loss already carries global w_t
                grad_norms.append(self._clip_and_step())
            if self.critic is not None:
                tc = time.perf_counter()
                cs = self.critic.train_part(part, self.pad_id)
                critic_norms.append(cs.pop("critic_grad_norm"))
                for k, v in cs.items():
                    critic_sums[k] = critic_sums.get(k, 0.0) + v
                self._critic_seconds += time.perf_counter() - tc
        self.version = WeightVersion(version=self.version.version + 1, step=self.optimizer_steps)
        if self.data_parallel:  # the metrics of the whole batch, as one process would report them
            sums = dp.all_reduce_floats({**sums, "processed_tokens": float(processed_tokens)}, self.device)
            processed_tokens = int(sums.pop("processed_tokens"))
            gap_max = dp.all_reduce_floats({"gap_max": gap_max}, self.device, op="max")["gap_max"]
        seconds = time.perf_counter() - t0
        n = max(sums["tokens"], 1.0)
        if grad_norms:
            metrics.update(
                loss=sums["loss"] / len(grad_norms),
                grad_norm=sum(grad_norms) / len(grad_norms),
                clip_frac=sums["clipped"] / n,
                ratio_mean=sums["ratio"] / n,
                kl_old=sums["kl_old"] / n,
                kl_ref=sums["kl_ref"] / n,
                engine_kl_mean=sums["gap_sum"] / max(sums["gap_tokens"], 1.0),
                engine_kl_max=gap_max,
                engine_tokens=sums["gap_tokens"],
            )
            if c.tis:
                metrics.update(tis_weight_mean=sums["tis_sum"] / n,
                               tis_capped_frac=sums["tis_capped"] / max(sums["gap_tokens"], 1.0))
        if critic_norms:
            turns = max(critic_sums.get("turns", 0.0), 1.0)
            metrics.update(
                value_loss=critic_sums["value_loss"] / len(critic_norms),
                value_mse=critic_sums["value_sq_err"] / turns,
                value_clip_frac=critic_sums["value_clipped"] / turns,
                critic_grad_norm=sum(critic_norms) / len(critic_norms),
            )
        metrics.update(
            lr=float(self.scheduler.get_last_lr()[0]),
            optimizer_steps=float(self.optimizer_steps),
            version=float(self.version.version),
            processed_tokens=float(processed_tokens),
            seconds=seconds,
            tokens_per_s=processed_tokens / seconds,
        )
        return metrics

    @property
    def data_parallel(self) -> bool:
        """Whether this learner is one of several data-parallel ranks (``learner.data_parallel`` > 1)."""
        return self.world_size > 1 and self.cfg.data_parallel > 1

    def _my_share(self, part: list[TokenSequence]) -> list[TokenSequence]:
        """This rank's sequences of ``part`` (all of them without data parallelism), balanced by tokens."""
        if not self.data_parallel:
            return part
        return [part[i] for i in dp.shard([len(s) for s in part], self.rank, self.world_size)]

    def _mini_batches(self, sequences: list[TokenSequence]) -> Iterator[list[TokenSequence]]:
        """Split the batch by trajectory into ``mini_batches`` parts (shuffled), each with its own ``w_t``."""
        import torch

        m = self.cfg.mini_batches
        if m == 1:
            yield sequences
            return
        samples = sorted({s.sample for s in sequences})
        perm = torch.randperm(len(samples), generator=self.generator).tolist()
        for k in range(m):
            chosen = {samples[i] for i in perm[k::m]}
            part = [s for s in sequences if s.sample in chosen]
            if part:
                assign_weights(part, self.cfg.loss_agg, self.cfg.max_response_tokens)
                yield part

    def _old_logprobs(self, sequences: list[TokenSequence]) -> dict[int, list[float]] | None:
        """Learner-computed ``log pi_old`` per sequence (keyed by ``id``) before the first update; None when
        it is ``pi_theta`` detached (one mini-batch). With ``behaviour_logprobs: engine`` it is not the ratio's
        ``pi_old`` but still the learner side of the engine/learner gap metrics."""
        if self.cfg.mini_batches == 1:
            return None
        lps = self.sequence_logprobs([s.input_ids for s in sequences], self.temperature)
        return {id(s): lp for s, lp in zip(sequences, lps, strict=True)}

    def _gather_old(self, old: dict[int, list[float]], part: list[TokenSequence], idx: list[int], shape: Any) -> Any:
        import torch

        out = torch.zeros(shape, dtype=torch.float32)
        for row, i in enumerate(idx):
            vals = old[id(part[i])]
            out[row, : len(vals)] = torch.tensor(vals, dtype=torch.float32)
        return out.to(self.device)

    def _clip_and_step(self) -> float:
        import torch

        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return norm

    # -- weights for the engines --------------------------------------------------------------------
    def sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The current policy as checkpoint-format ``(HF name, tensor)`` pairs (LoRA merged, detached)."""
        return sync_weights(self.model)

    # -- checkpoints (the format: ``learner.checkpoint``) -------------------------------------------------
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write the full training state to ``directory`` (atomically; with FSDP, gathered to rank 0)."""
        directory = Path(directory)
        model_sd = optim_sd = None
        if self.cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_sd = get_model_state_dict(self.model, options=opts)
            optim_sd = get_optimizer_state_dict(self.model, self.optimizer, options=opts)
        if not checkpoint.is_rank0():
            return directory
        lora = is_peft(self.model)

        def write_model(folder: Path) -> None:
            if lora:
                self.model.save_pretrained(folder / checkpoint.ADAPTER_DIR, state_dict=model_sd)
            else:
                self.model.save_pretrained(folder / checkpoint.MODEL_DIR, state_dict=model_sd)
                self.tokenizer.save_pretrained(folder / checkpoint.MODEL_DIR)
            if self.critic is not None:
                checkpoint.write_critic(folder, self.critic.state_dict())

        state = {
            "optimizer": optim_sd if optim_sd is not None else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "optimizer_steps": self.optimizer_steps,
            "version": [self.version.version, self.version.step],
            "rng": checkpoint.rng_state(self.generator),
        }
        meta = {
            "base_model": str(self.reference_path),
            "lora": lora,
            "seed": self.seed,
            "temperature": self.temperature,
            "version": self.version.version,
            "optimizer_steps": self.optimizer_steps,
            "algorithm": self.cfg.algorithm,
        }
        return checkpoint.write_checkpoint(directory, write_model, state, meta)

    @classmethod
    def from_checkpoint(cls, cfg: LearnerConfig, directory: str | Path, temperature: float = 1.0) -> Learner:
        """Rebuild a learner from ``directory`` so that its next ``step`` equals the uninterrupted run's.

        With PPO the critic (weights, optimizer, schedule, counters) comes back too; a checkpoint without
        one (e.g. a GRPO run continued as PPO) starts a fresh critic."""
        directory = Path(directory)
        meta = checkpoint.read_meta(directory)
        if bool(meta["lora"]) != cfg.lora.enabled:
            raise ValueError(
                f"checkpoint {directory} has lora={meta['lora']} but learner.lora.enabled={cfg.lora.enabled}"
            )
        base = meta["base_model"]
        if meta["lora"]:
            learner = cls(cfg, base, seed=meta["seed"], temperature=temperature, reference_path=base)
            checkpoint.load_adapter(learner.model, directory)
        else:
            learner = cls(cfg, directory / checkpoint.MODEL_DIR, seed=meta["seed"], temperature=temperature,
                          reference_path=base)
        state = checkpoint.read_state(directory)
        if cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(
                learner.model, learner.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
            )
        else:
            learner.optimizer.load_state_dict(state["optimizer"])
        learner.scheduler.load_state_dict(state["scheduler"])
        learner.optimizer_steps = int(state["optimizer_steps"])
        learner.version = WeightVersion(*state["version"])
        if learner.critic is not None and checkpoint.has_critic(directory):
            learner.critic.load_state_dict(checkpoint.read_critic(directory))
        checkpoint.set_rng_state(learner.generator, state["rng"])
        return learner
