"""Behaviour cloning (the warm start, the paper's SFT baseline) on the GRPO learner's own machinery.

Not a second trainer: the gold episodes become the same token sequences a GRPO batch uses
(``learner.sequences``: agent prompt masked, the policy's reply tokens trained), every trajectory gets
the advantage ``A_i = 1`` and the loss is ``dreamgym.grpo.policy_loss`` with ``pi_old = pi_theta``
detached. Then ``rho = 1`` and the gradient of ``-sum_t w_t rho_t A_i`` is ``-sum_t w_t grad log pi(o_t)``:
with token-mean weights exactly the gradient of the mean negative log-likelihood of the gold replies.

The warm start has its own AdamW (``train.warm_start.lr``) over the learner's parameters, so the GRPO
optimizer's moments and learning-rate schedule start fresh when RL begins.

Gold replies are rendered the way the policy engine would sample them: ``<action>gold action</action>``
(generation stops after the closing tag), tokenised with the policy's tokenizer after the chat-templated
agent prompt of that step (``dreamgym.agent_prompt``).

No Ray here: the gold episodes come from ``actors.train_setup.gold_for_warm_start`` (the offline data, else
a collection with the gold policy); ``dreamgym sft`` is ``dreamgym.commands.train``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym.agent_prompt import ACTION_TAG, build_messages
from dreamgym.data.expert import gold_episodes
from dreamgym.grpo import policy_loss
from dreamgym.types import AgentTurn, Observation, Task, Trajectory, Transition
from learner.batching import collate
from learner.sequences import TokenSequence, assign_weights, trajectory_sequences

__all__ = ["BehaviourCloning", "bc_sequences", "gold_episodes", "run_bc", "save_policy", "tokenise_episode"]

if TYPE_CHECKING:
    from dreamgym.config import PolicyConfig
    from learner.learner import Learner


def tokenise_episode(steps: Sequence[Transition], tokenizer: Any, policy: PolicyConfig) -> Trajectory:
    """A gold episode as a trajectory with the token ids the policy engine would have produced."""
    first = steps[0]
    task = Task(task_id=first.task_id, env=first.env, instruction=first.instruction)
    history: list[tuple[str, str]] = []
    out = []
    for t in steps:
        obs = Observation(text=t.state, state=t.state, admissible_actions=t.admissible_actions,
                          instruction=t.instruction)
        messages = build_messages(AgentTurn(task=task, observation=obs, history=list(history)), policy.reasoning,
                                  policy.history_steps, policy.max_admissible_shown, policy.observation_max_chars,
                                  policy.worked_example)
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
            prompt = prompt["input_ids"]
        reply = tokenizer.encode(f"<{ACTION_TAG}>{t.action}</{ACTION_TAG}>", add_special_tokens=False)
        out.append(Transition(**{**t.to_dict(), "prompt_token_ids": [int(i) for i in prompt],
                                 "action_token_ids": list(reply), "action_logprobs": [0.0] * len(reply),
                                 "weight_version": 0}))
        history.append((t.action, t.next_state))
    return Trajectory(task=task, transitions=out, success=True, total_reward=sum(t.reward for t in steps))


def bc_sequences(trajectories: Sequence[Trajectory]) -> list[TokenSequence]:
    """GRPO token sequences of the gold trajectories, each with ``A_i = 1`` and token-mean weights."""
    seqs = []
    for i, traj in enumerate(trajectories):
        for s in trajectory_sequences(traj, sample=i):
            s.advantage = 1.0
            seqs.append(s)
    assign_weights(seqs, "token-mean", 1)
    return seqs


class BehaviourCloning:
    """Warm-start steps on a ``Learner``'s model with a separate AdamW."""

    def __init__(self, learner: Learner, lr: float) -> None:
        import torch

        self.learner = learner
        self.optimizer = torch.optim.AdamW(learner.params, lr=lr, weight_decay=0.0)
        self.steps = 0

    def step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One optimizer step on ``trajectories``; returns ``nll`` (mean per gold reply token) and counts
        (``processed_tokens``: token positions the model ran, a shared prefix once per micro-batch)."""
        import time

        import torch

        t0 = time.perf_counter()
        lrn = self.learner
        seqs = bc_sequences(trajectories)
        self.optimizer.zero_grad(set_to_none=True)
        nll_sum = tokens = processed = 0.0
        lrn.model.train()
        # The GRPO learner's micro-batching and forward: with ``learner.shared_prefix`` the gold steps' common
        # prompt prefix (system text, worked example, task) runs once per micro-batch, as in an RL step.
        for idx in lrn._micro_batches(seqs):
            mb = collate(seqs, idx, lrn.pad_id, lrn.device)
            with lrn._autocast():
                logp, forwarded = lrn._token_logprobs(lrn.model, mb, 1.0, mb.mask)
            terms = policy_loss(logp, logp.detach(), mb.advantages, mb.weights, mb.mask)
            terms.loss.backward()
            nll_sum += float(-(logp.detach() * mb.mask).sum())
            tokens += terms.tokens
            processed += forwarded
        clip = lrn.cfg.grad_clip if lrn.cfg.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(lrn.params, clip))
        self.optimizer.step()
        self.steps += 1
        seconds = time.perf_counter() - t0
        return {"bc_step": float(self.steps), "nll": nll_sum / max(tokens, 1.0), "policy_tokens": tokens,
                "processed_tokens": processed, "grad_norm": norm, "seconds": seconds,
                "tokens_per_s": processed / seconds if seconds else 0.0}


def run_bc(step: Any, trajectories: Sequence[Trajectory], steps: int, batch_episodes: int, seed: int = 0,
           log: Any = None) -> list[dict[str, float]]:
    """``steps`` behaviour-cloning steps, each on a seeded sample of ``batch_episodes`` gold trajectories.
    ``step(batch) -> metrics`` is ``BehaviourCloning.step`` or the learner actor's ``warm_start_step``."""
    import random

    rng = random.Random(seed)
    history = []
    for _ in range(steps):
        m = step(rng.sample(list(trajectories), min(batch_episodes, len(trajectories))))
        history.append(m)
        if log is not None:
            log(m)
    return history


def save_policy(learner: Learner, out: str | Path) -> Path:
    """The learner's current policy as a plain HF folder (LoRA merged) that the engines and the learner load."""
    from learner.model import is_peft

    model = learner.model.merge_and_unload() if is_peft(learner.model) else learner.model
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    learner.tokenizer.save_pretrained(out)
    gen = learner.model_path / "generation_config.json"
    if gen.is_file():
        (out / "generation_config.json").write_text(gen.read_text())
    return out
