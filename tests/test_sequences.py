"""Trajectories -> token sequences: the loss mask covers exactly the policy's own tokens."""

from __future__ import annotations

import pytest
import torch
from grpo_helpers import random_groups, step_transition

from dreamgym.types import Group, Task, Trajectory
from learner.batching import collate, micro_batches
from learner.sequences import build_batch, trajectory_sequences

TASK = Task("t", "twx:coin", "find the coin")


def test_fresh_prompt_per_step_gives_one_sequence_per_step() -> None:
    steps = [
        step_transition(TASK, 0, [1, 10, 11], [50, 51], 0.0, [-0.1, -0.2]),
        step_transition(TASK, 1, [1, 12, 13, 14], [52], 1.0, [-0.3]),
    ]
    seqs = trajectory_sequences(Trajectory(TASK, steps, True, 1.0), sample=7)
    assert [s.input_ids for s in seqs] == [[1, 10, 11, 50, 51], [1, 12, 13, 14, 52]]
    assert [s.loss_mask for s in seqs] == [[False, False, False, True, True], [False] * 4 + [True]]
    assert seqs[0].behaviour_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2]
    assert {s.sample for s in seqs} == {7}


def test_multi_turn_chat_prompts_merge_and_mask_only_replies() -> None:
    # prompt_1 = prompt_0 + reply_0 + observation_1 (a chat transcript that grows): one sequence.
    p0, r0 = [1, 10, 11], [50, 51, 2]
    obs1, r1 = [20, 21, 22], [52, 2]
    obs2, r2 = [23], [53]
    steps = [
        step_transition(TASK, 0, p0, r0, 0.0),
        step_transition(TASK, 1, p0 + r0 + obs1, r1, 0.0),
        step_transition(TASK, 2, p0 + r0 + obs1 + r1 + obs2, r2, 1.0),
    ]
    (seq,) = trajectory_sequences(Trajectory(TASK, steps, True, 1.0))
    assert seq.input_ids == p0 + r0 + obs1 + r1 + obs2 + r2
    policy_tokens = [t for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m]
    assert policy_tokens == r0 + r1 + r2
    assert seq.loss_mask == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 2 + [False] + [True]


def test_steps_without_tokens_are_refused() -> None:
    tr = step_transition(TASK, 0, [1], [2], 1.0)
    tr.action_token_ids = None
    with pytest.raises(ValueError, match="no token ids"):
        trajectory_sequences(Trajectory(TASK, [tr], True, 1.0))


def test_batch_drops_degenerate_groups_and_weights_tokens() -> None:
    groups = random_groups(0, n_groups=2, group_size=4)
    same = Group(TASK, [Trajectory(TASK, [step_transition(TASK, 0, [1, 3], [4, 5], 1.0)], True, 1.0)] * 4)
    batch = build_batch([*groups, same], agg="token-mean")
    assert batch.advantages.degenerate == 1 and batch.num_samples == 8
    assert len(batch.rewards) == 12
    total = sum(s.num_policy_tokens for s in batch.sequences)
    assert sum(s.weight * s.num_policy_tokens for s in batch.sequences) == pytest.approx(1.0)
    assert all(s.weight == pytest.approx(1 / total) for s in batch.sequences)
    seq_mean = build_batch(groups, agg="seq-mean-token-mean")
    assert all(s.weight * s.num_policy_tokens == pytest.approx(1 / 8) for s in seq_mean.sequences)


def test_micro_batches_respect_the_token_budget_and_cover_everything() -> None:
    lengths = [5, 17, 3, 9, 9, 40, 1, 12]
    mbs = micro_batches(lengths, token_budget=24)
    assert sorted(i for mb in mbs for i in mb) == list(range(len(lengths)))
    for mb in mbs:
        assert max(lengths[i] for i in mb) * len(mb) <= 24 or len(mb) == 1


def test_collated_mask_marks_targets_that_are_policy_tokens() -> None:
    batch = build_batch(random_groups(1, n_groups=2, group_size=2))
    seqs = batch.sequences
    mb = collate(seqs, list(range(len(seqs))), pad_id=0, device="cpu")
    for row, s in enumerate(seqs):
        n = len(s)
        # column j predicts token j+1: masked iff token j+1 is a reply token
        assert mb.mask[row, : n - 1].tolist() == s.loss_mask[1:]
        assert not mb.mask[row, n - 1 :].any()
        assert mb.input_ids[row, :n].tolist() == s.input_ids
        assert torch.all(mb.weights[row, : n - 1] == s.weight)
