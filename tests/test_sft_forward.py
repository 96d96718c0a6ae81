"""The experience-model fine-tune's shared-prefix forward computes the padded forward's objective.

``experience_model.train.forward: shared-prefix`` (the default) runs the prompts' common prefix once and each
example unpadded on its cache; ``padded`` is the forward it replaced. On a tiny random Llama in fp32 both give the
same per-example reasoning and outcome NLLs, and one training step from the same weights gives the same weights.
The fine-tune's own AdamW is torch's fused kernel, the same update as the per-op one.
"""

from __future__ import annotations

from pathlib import Path

from experience_data import HALL, KITCHEN, toy_row, write_toy


def test_shared_prefix_forward_gives_the_padded_losses_and_step(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.config import load_config
    from dreamgym.models import build_tiny_model
    from learner.sft_experience import batch_nll, build_examples, sft_step, shared_prefix_nll
    from learner.shared_prefix import MIN_PREFIX, common_prefix_len

    rows = [toy_row("e0", 0, HALL, "go north", KITCHEN, 1.0, True, True, "The agent goes north."),
            toy_row("e1", 0, HALL, "look", HALL, 0.0, False, False, None),
            toy_row("e2", 0, KITCHEN, "look", KITCHEN + " A table stands here.", 0.0, False, False,
                    "Looking around shows the room again, and a table in it that the state did not list.")]
    data = write_toy(tmp_path / "toy.parquet", rows)
    base = build_tiny_model(tmp_path / "base")
    cfg = load_config(None, {"experience_model": {"top_k": 1, "train": {"data": str(data), "retrieval": "overlap"}}})
    tok = AutoTokenizer.from_pretrained(base)
    examples, _ = build_examples(data, tok, cfg.experience_model)
    assert len(examples) == 3 and len({len(ex) for ex in examples}) == 3  # padding would be needed
    prompts = [ex.prompt_ids for ex in examples]
    assert common_prefix_len(prompts) >= MIN_PREFIX  # the system text: shared and run once

    torch.manual_seed(0)
    old, new = (AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32) for _ in range(2))
    with torch.no_grad():
        r_old, o_old = batch_nll(old, examples, pad_id=tok.eos_token_id)
        r_new, o_new = shared_prefix_nll(new, examples)
        r_alone, o_alone = shared_prefix_nll(new, examples, min_prefix=10**6)  # no prefix: each example alone
    for got in ((r_new, o_new), (r_alone, o_alone)):
        torch.testing.assert_close(got[0], r_old, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], o_old, rtol=1e-5, atol=1e-5)

    # One training step each (SGD: an update proportional to the gradient, so equal weights mean equal gradients;
    # Adam's first step is about lr * sign(g) and turns float rounding of near-zero gradients into lr-sized gaps).
    steps = []
    for model, forward in ((old, "padded"), (new, "shared-prefix")):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=0.1)
        steps.append(sft_step(model, opt, params, examples, 4096, pad_id=tok.eos_token_id, forward=forward))
    assert steps[0][2:] == steps[1][2:] and abs(steps[0][0] - steps[1][0]) < 1e-5 * abs(steps[0][0])
    for (name, a), b in zip(old.named_parameters(), new.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7, msg=name)
