"""``dreamgym study``: the aggregation (mean, 95% t-interval), the arms' configs, and a real tiny study.

The tiny study runs the real command end to end: it collects the offline data once (``dreamgym collect``), then
runs each arm-seed as a real ``dreamgym train`` subprocess (TextWorldExpress coin, a tiny random Llama served by
vLLM and trained by the GRPO learner, the embedded replay buffer). Each subprocess joins the test session's Ray
cluster (``ray.address``) instead of starting one of its own, as on a cluster. The experience model is an
OpenAI-compatible server on loopback that pays every other request it gets, so synthetic groups have reward
variance and learner steps happen.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_openai_server import ScriptedOpenAIServer
from test_train import tiny_config

from dreamgym.cli import main
from dreamgym.config import STUDY_ARMS, load_config, validate_config
from dreamgym.errors import ConfigError
from dreamgym.eval_records import final_records
from dreamgym.experience.prompts import format_reply
from dreamgym.study.arms import arm_seed_config, experience_variant, s2r_budget, s2r_real_iterations
from dreamgym.study.stats import Interval, mean_interval, t975

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


# -- aggregation -------------------------------------------------------------------------------------------
def test_mean_and_95_t_interval_against_a_hand_computed_example() -> None:
    # values 0.5, 0.75, 0.625: mean 0.625; s = sqrt((0.125^2 + 0.125^2 + 0) / 2) = 0.125;
    # half-width = t_{0.975, 2} * s / sqrt(3) = 4.303 * 0.125 / 1.7320508 = 0.310542
    iv = mean_interval([0.5, 0.75, 0.625])
    assert iv.n == 3 and iv.mean == pytest.approx(0.625)
    assert iv.low == pytest.approx(0.625 - 0.310542, abs=1e-6) and iv.high == pytest.approx(0.625 + 0.310542, abs=1e-6)
    assert iv.format() == "62.5% [31.4, 93.6]"
    # two seeds: t_{0.975, 1} = 12.706; s = sqrt(0.02) for 0.4, 0.6
    two = mean_interval([0.4, 0.6])
    assert two.high - two.mean == pytest.approx(12.706 * math.sqrt(0.02) / math.sqrt(2))
    # a success rate cannot leave 0..1: the table's interval is cut there
    assert (two.clipped().low, two.clipped().high, two.clipped().mean) == (0.0, 1.0, 0.5)


def test_one_seed_has_no_interval_and_none_has_no_mean() -> None:
    one = mean_interval([0.7])
    assert (one.n, one.mean, one.low, one.high) == (1, 0.7, None, None)
    assert one.format() == "70.0% (95% CI n/a, 1 seed)"
    assert mean_interval([]).format() == "-" and Interval(**mean_interval([]).to_dict()).mean is None


def test_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(30) == 2.042
    assert t975(60) == pytest.approx(2.000, abs=1e-3) and t975(120) == pytest.approx(1.980, abs=1e-3)
    assert t975(10_000) == pytest.approx(1.960, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_exact_mcnemar_against_hand_computed_binomial_tails() -> None:
    from dreamgym.study.paired import mcnemar_exact

    assert mcnemar_exact(3, 0) == pytest.approx(2 * 1 / 8)  # P(X <= 0), X ~ Bin(3, 1/2)
    assert mcnemar_exact(5, 1) == pytest.approx(2 * (1 + 6) / 64)  # P(X <= 1), X ~ Bin(6, 1/2)
    assert mcnemar_exact(1, 5) == mcnemar_exact(5, 1)
    assert mcnemar_exact(2, 2) == 1.0 and mcnemar_exact(0, 0) == 1.0  # capped; no discordant pair
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)


def test_paired_difference_bootstrap_and_power_against_hand_computed_values() -> None:
    from dreamgym.study.paired import compare, paired_bootstrap, power_table, seeds_needed, spread

    a = {(0, "t1", 0): 1.0, (0, "t2", 0): 1.0, (0, "t3", 0): 0.0, (0, "t4", 0): 1.0}
    b = {(0, "t1", 0): 0.0, (0, "t2", 0): 1.0, (0, "t3", 0): 0.0, (1, "t1", 0): 1.0}  # (1, t1) has no pair
    c = compare(a, b, resamples=500)
    assert (c["n"], c["n10"], c["n01"], c["seeds"], c["tasks"]) == (3, 1, 0, [0], 3)
    assert c["diff"] == pytest.approx(1 / 3) and c["p_mcnemar"] == 1.0
    assert compare(a, b, resamples=500) == c  # seeded: the same records give the same interval
    # one seed, two tasks with differences 0 and 1: a resample's mean is 0, 0.5 or 1 (p = 1/4, 1/2, 1/4), so the
    # 2.5% and 97.5% percentiles are exactly 0 and 1
    assert paired_bootstrap({0: {"x": [0.0], "y": [1.0]}}) == (0.0, 1.0)
    assert paired_bootstrap({0: {"x": [0.5], "y": [0.5]}, 1: {"x": [0.5]}}) == (0.5, 0.5)
    assert compare(a, {}, resamples=10)["diff"] is None
    # spread: seed 0 differences [1, 0, 0, -1] (mean 0), seed 1 [1, 1, 0, 0] (mean 0.5): pooled within-seed
    # variance (2 + 1) / 6 = 0.5; variance of the seed means 0.125 minus 0.5 / 4 episodes = 0 between seeds
    cells = {0: {"t1": [1.0], "t2": [0.0], "t3": [0.0], "t4": [-1.0]}, 1: {"t1": [1.0], "t2": [1.0], "t3": [0.0],
                                                                           "t4": [0.0]}}
    sp = spread(cells)
    assert sp["sigma_episode2"] == pytest.approx(0.5) and sp["sigma_seed2"] == pytest.approx(0.0)
    # (1.959964 + 0.841621)^2 x 0.5 / 64 / 0.1^2 = 6.13 -> 7 seeds of 64 episodes resolve 10 points;
    # with a between-seed variance of 0.01: 7.84888 x (0.01 + 0.5 / 64) / 0.01 = 13.98 -> 14
    assert seeds_needed(0.5, 0.0, 64) == 7 and seeds_needed(0.5, 0.01, 64) == 14
    pw = power_table(sp)
    assert pw["rows"][0] == {"episodes_per_seed": 4, "seeds_needed": 99}
    assert power_table(spread({0: {"x": [0.0], "y": [0.0]}}))["rows"] == []  # no spread: no claim of power
    assert pw["resolvable_now"] == pytest.approx(2.801585 * (0.5 / 4 / 2) ** 0.5, rel=1e-5)


# -- the arms' configs -------------------------------------------------------------------------------------
def _study_cfg(**study: Any) -> Any:
    return validate_config({"train": {"iterations": 10, "real_budget": 500, "experience_sft": True,
                                      "eval": {"first_seed": 7}},
                            "study": study})


def test_every_arm_shares_steps_data_and_held_out_seeds(tmp_path: Path) -> None:
    cfg = _study_cfg(seeds=3, arm_seeds={"no-rules": 1})
    assert cfg.study.seeds == [0, 1, 2] and tuple(cfg.study.arms) == STUDY_ARMS
    assert cfg.study.seeds_of("no-rules") == [0] and cfg.study.seeds_of("dreamgym") == [0, 1, 2]
    with pytest.raises(ConfigError, match="arm_seeds for unknown arm"):
        _study_cfg(arm_seeds={"copysim": 1})
    offline = tmp_path / "offline.parquet"
    arms = {a: arm_seed_config(cfg, a, 1, offline, real_budget=42) for a in STUDY_ARMS}
    for a, c in arms.items():
        assert c.train.offline_data == offline and c.run.seed == 1 and c.policy.engine.seed == 1
        assert (c.train.eval.tasks, c.train.eval.first_seed, c.train.eval.split) == (64, 7, "test"), a
        assert c.train.iterations == (0 if a in ("base", "bc") else 10), a
    assert arms["base"].train.eval.at_start and not arms["real"].train.eval.at_start
    assert arms["real"].train.mode == "real" and arms["real"].train.real_budget is None
    assert arms["dreamgym"].train.mode == "synthetic"
    s2r = arms["dreamgym-s2r"].train
    assert (s2r.mode, s2r.synthetic_iterations, s2r.real_budget) == ("s2r", 9, 42)  # 10% of 10 iterations: 1 real
    assert arms["no-retrieval"].experience_model.top_k == 0 and arms["dreamgym"].experience_model.top_k == 3
    assert arms["no-reasoning"].experience_model.reasoning is False
    assert arms["no-task-generation"].curriculum.generate_every == 0
    rules = arms["no-rules"].experience_model
    assert not rules.check_reward_rule and rules.inadmissible == "model" and arms["no-rules"].train.mode == "synthetic"
    assert arms["copy-sim"].experience_model.backend == "copy" and not arms["copy-sim"].train.experience_sft
    bc = arms["bc"].train  # as many learner steps as the trained arms, as many episodes a step as a GRPO step
    assert (bc.mode, bc.iterations, bc.warm_start.method, bc.warm_start.steps) == ("real", 0, "sft", 10)
    assert bc.warm_start.batch_episodes == cfg.curriculum.tasks_per_iteration * cfg.learner.group_size
    assert bc.eval.at_start and arms["bc"].run.seed == arms["base"].run.seed == 1
    # the fine-tuned experience model is shared where its settings agree, not where an ablation changes them
    variants = {a: experience_variant(c) for a, c in arms.items()}
    assert variants["dreamgym"] == variants["dreamgym-s2r"] == variants["no-task-generation"]
    assert len({variants["dreamgym"], variants["no-retrieval"], variants["no-reasoning"]}) == 3
    assert experience_variant(arm_seed_config(cfg, "dreamgym", 2, offline)) == variants["dreamgym"]


def test_per_arm_overrides_and_their_errors(tmp_path: Path) -> None:
    cfg = _study_cfg(overrides={"real": {"learner.lr": 1e-5}, "dreamgym": {"learner": {"lr": 2e-5}}})
    assert arm_seed_config(cfg, "real", 0, None).learner.lr == 1e-5
    assert arm_seed_config(cfg, "dreamgym", 0, None).learner.lr == 2e-5
    assert arm_seed_config(cfg, "no-retrieval", 0, None).learner.lr == cfg.learner.lr
    bad = _study_cfg(overrides={"real": {"learner.lr": -1}})
    with pytest.raises(ConfigError, match=r"study arm real, seed 0: invalid configuration:\n  learner.lr"):
        arm_seed_config(bad, "real", 0, None)
    with pytest.raises(ConfigError, match="unknown arm"):
        validate_config({"study": {"overrides": {"rael": {}}}})
    with pytest.raises(ConfigError, match="seeds must be distinct"):
        load_config(None, ["--study.seeds", "[1, 1]"])
    with pytest.raises(ConfigError, match="leave no synthetic one"):
        arm_seed_config(_study_cfg(s2r_real_iterations=10), "dreamgym-s2r", 0, None)


def test_offline_split_counts_expert_episodes_and_bc_refuses_data_without_any(tmp_path: Path) -> None:
    from experience_data import HALL, KITCHEN, TOY_ENV, toy_row, write_toy

    from dreamgym.commands.study import check_expert_data
    from dreamgym.data.expert import offline_split
    from dreamgym.study.results import offline_used

    rows = [toy_row("g0", 0, HALL, "look", HALL, 0.0, False, False),  # a 2-step gold win
            toy_row("g0", 1, HALL, "go north", KITCHEN, 1.0, True, True),
            {**toy_row("r0", 0, HALL, "look", HALL, 0.0, False, False), "policy": "random"},
            {**toy_row("g1", 0, HALL, "look", HALL, 0.0, True, False)}]  # gold but lost: not expert
    data = write_toy(tmp_path / "mixed.parquet", rows)
    assert offline_split(data) == {"total": 4, "expert": 2, "other": 2, "expert_episodes": 1}
    synthetic = {"env": {"name": TOY_ENV}, "train": {"mode": "synthetic", "offline_data": str(data)}}
    bc = {"env": {"name": TOY_ENV}, "train": {"mode": "real", "offline_data": str(data),
                                              "warm_start": {"method": "sft", "episodes": 64}}}
    assert offline_used(synthetic) == {"offline_real_transitions": 4, "offline_expert_transitions": 2,
                                       "offline_other_transitions": 2}
    assert offline_used(bc)["offline_real_transitions"] == 2 and offline_used({"train": {"mode": "real"}}) == {
        "offline_real_transitions": 0, "offline_expert_transitions": 0, "offline_other_transitions": 0}
    cfg = validate_config({"env": {"name": TOY_ENV}})
    check_expert_data(cfg, data)
    random_only = write_toy(tmp_path / "random.parquet", rows[2:3])
    with pytest.raises(ConfigError, match="the bc arm clones the offline data's expert episodes"):
        check_expert_data(cfg, random_only)


def test_s2r_budget_is_a_share_of_the_real_arm() -> None:
    cfg = _study_cfg()
    assert s2r_real_iterations(cfg) == 1
    assert s2r_budget(cfg, [400, 500])[0] == 45  # floor(0.1 * 450)
    assert s2r_budget(_study_cfg(s2r_real_budget=30), [])[0] == 30
    with pytest.raises(ConfigError, match="run the real arm first"):
        s2r_budget(cfg, [])


@pytest.mark.parametrize("name", ["study-cpu.yaml", "study-coin5-cpu.yaml", "study-gpu.yaml"])
def test_the_study_configs_are_valid_for_every_arm(name: str, tmp_path: Path) -> None:
    from actors.train_setup import requested_resources
    from dreamgym.placement import plan_placement

    cfg = load_config(REPO / "configs" / name)
    assert len(cfg.study.seeds) >= 2 and set(cfg.study.arms) <= set(STUDY_ARMS)
    assert cfg.study.eval_episodes is not None and cfg.study.eval_episodes >= 64
    for arm in STUDY_ARMS:
        c = arm_seed_config(cfg, arm, cfg.study.seeds[-1], tmp_path / "offline.parquet", real_budget=10)
        if name != "study-gpu.yaml":
            assert c.policy.model == c.experience_model.model == "smollm2-135m"
            assert requested_resources(c) <= (2.0, 0.0), arm  # fits the 2-core machine
        else:
            assert "/" in c.policy.model and "/" in c.experience_model.model  # hub ids
            # the header's table: learner 1 + engines 2 (+ replicas 2 where a model plays the environment); the
            # base arm only evaluates: no learner
            expected = {"base": 2, "real": 3, "copy-sim": 3, "bc": 3}.get(arm, 5)
            assert plan_placement(c).total_gpus == expected, arm
            roles = {a.role for a in plan_placement(c).actors}
            assert ("learner" in roles) == (arm != "base") and ("replay-shard" in roles) == (arm not in ("base", "bc"))
    if name == "study-gpu.yaml":  # S2R at the paper's budget: 2 real iterations of 20
        assert s2r_real_iterations(cfg) == 2 and cfg.train.iterations == 20
    if name == "study-coin5-cpu.yaml":  # the headroom setting: the controls, 3 seeds, 10 iterations (issue 30)
        assert {"copy-sim", "bc"} <= set(cfg.study.arms) and len(cfg.study.seeds) >= 3 and cfg.train.iterations >= 10


def _arm(success: list[float], **kw: Any) -> dict[str, Any]:
    return {"success": mean_interval(success).clipped().to_dict(), "learner_steps": 3.0, "iterations_configured": [3],
            "mixed_group_share": 0.5, "synthetic_transitions": 0, "invalid_transitions": 0, **kw}


def test_the_papers_pattern_is_checked_and_a_failing_claim_names_the_parts_to_look_at() -> None:
    from dreamgym.study.pattern import paper_pattern, pattern_lines

    arms = {"base": _arm([0.60, 0.61, 0.62]), "real": _arm([0.80, 0.81, 0.82]),
            "dreamgym": _arm([0.70, 0.71, 0.72], synthetic_transitions=100, invalid_transitions=5,
                             synthetic_success=0.95, reward_success_agreement=0.9, mixed_group_share=0.25),
            "no-retrieval": _arm([0.60, 0.61, 0.62])}
    claims = {c["claim"]: c for c in paper_pattern(arms)}
    dg = claims["DreamGym >= 0.95 x real-environment GRPO"]
    assert dg["holds"] is False and dg["resolved"] is True  # 71% < 0.95 x 81%, intervals apart
    why = " ".join(dg["diagnosis"])
    assert "invalid synthetic transitions 5.0%" in why and "reward/success agreement 90.0%" in why
    assert "synthetic success 95.0% vs held-out real 71.0%" in why and "groups with reward variance 25.0%" in why
    assert claims["no-retrieval below DreamGym"]["holds"] is True
    assert claims["DreamGym-S2R above DreamGym"]["holds"] is None  # no such arm yet
    text = "\n".join(pattern_lines(list(claims.values())))
    assert "DOES NOT HOLD" in text and "n/a: not measured" in text


def test_the_pattern_is_judged_on_paired_intervals_when_episodes_were_kept() -> None:
    from dreamgym.study.pattern import paper_pattern

    arms = {"real": _arm([0.80, 0.82]), "dreamgym": _arm([0.70, 0.72]), "copy-sim": _arm([0.69, 0.71]),
            "no-rules": _arm([0.75])}
    paired = [{"a": "dreamgym", "b": "real", "scale": 0.95, "diff": -0.06, "ci95": [-0.10, -0.02], "p_mcnemar": 0.01,
               "n": 128},
              {"a": "dreamgym", "b": "copy-sim", "scale": 1.0, "diff": 0.01, "ci95": [-0.05, 0.07], "p_mcnemar": 0.8,
               "n": 128},
              {"a": "no-rules", "b": "dreamgym", "scale": 1.0, "diff": -0.03, "ci95": [-0.06, -0.01],
               "p_mcnemar": 0.04, "n": 64}]
    claims = {c["claim"]: c for c in paper_pattern(arms, paired)}
    share = claims["DreamGym >= 0.95 x real-environment GRPO"]
    assert share["holds"] is False and share["resolved"] is True and share["paired"]["n"] == 128
    assert "paired dreamgym - 0.95 x real -6.0 points [-10.0, -2.0]" in share["detail"]
    model = claims["DreamGym above the copy-top-1 simulator (the model earns its place)"]
    assert model["holds"] is True and model["resolved"] is False and "not resolved" in model["detail"]
    rules = claims["no-rules below DreamGym"]
    assert rules["holds"] is True and rules["resolved"] is True  # one seed, but a paired interval over episodes


def test_an_arm_seed_started_but_not_finished_is_reported_as_such_by_its_folder(tmp_path: Path) -> None:
    """A study stopped mid arm-seed cannot have updated the arm-seed's record ("running"): the table says it was
    started and not finished, and names its folder inside the study, not a path of the machine it ran on."""
    from dreamgym.config import save_config

    cfg = load_config(None, {"study": {"name": "stopped", "arms": ["base", "dreamgym"], "seeds": 1}})
    study = tmp_path / "study-stopped"
    (study / "dreamgym" / "seed-0").mkdir(parents=True)
    save_config(cfg, study / "study.yaml")
    save_config(arm_seed_config(cfg, "dreamgym", 0, tmp_path / "offline.parquet"), study / "dreamgym" / "seed-0" /
                "config.yaml")
    (study / "dreamgym" / "seed-0" / "study_run.json").write_text(json.dumps(
        {"arm": "dreamgym", "seed": 0, "attempts": 1, "status": "running"}))
    assert main(["study", "--report", str(study)]) == 0
    table = (study / "results.md").read_text()
    assert ("- dreamgym seed 0: started, not finished (still running, or stopped: --resume continues it) "
            "(dreamgym/seed-0)") in table
    assert str(tmp_path) not in table


def test_resume_overrides_apply_to_that_invocation_and_leave_the_design_alone(tmp_path: Path) -> None:
    import argparse

    from dreamgym.commands.study import _open
    from dreamgym.config import save_config

    study = tmp_path / "study-x"
    study.mkdir()
    save_config(load_config(None, {"study": {"name": "x", "seeds": 3}}), study / "study.yaml")
    before = (study / "study.yaml").read_text()
    args = argparse.Namespace(resume=str(study), config=None)
    cfg, d = _open(args, ["--study.seeds", "1", "--policy.engine.omp_threads", "2"])
    assert d == study and cfg.study.seeds == [0] and cfg.policy.engine.omp_threads == 2
    assert (study / "study.yaml").read_text() == before  # a later --resume still runs 3 seeds


def test_report_and_resume_need_a_study_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "--report", str(tmp_path)]) == 2
    assert main(["study", "--resume", str(tmp_path)]) == 2
    assert "not a study directory" in capsys.readouterr().err


# -- a real tiny study ---------------------------------------------------------------------------------------
class _EveryOtherPays:
    """The experience model: each reply ends the episode; every other request is paid (and successful), so the
    episodes of a group, which step together, get different rewards."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        with self.lock:
            self.calls += 1
            paid = self.calls % 2 == 0
        return format_reply("You are in the kitchen.", float(paid), True, paid, "the outcome of the action")


def _study(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "dreamgym"), "study", *args], capture_output=True, text=True, env=env,
                          timeout=2400, start_new_session=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 4 tiny train runs and a collection; a loaded 2-core box is slow
@pytest.mark.engine
def test_a_tiny_study_runs_resumes_and_reports(ray_cluster, tmp_path: Path) -> None:
    """DreamGym, the base policy, the copy-top-1 simulator and behaviour cloning, one seed each (the arms are
    paired on seed 0's held-out episodes; the interval over seeds is checked above, by hand). The first command
    runs the DreamGym arm only, ``--resume`` the others, ``--report`` rebuilds the table. Every run joins the
    session's Ray cluster: the study's parts, not Ray's start, are under test."""
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    model = _EveryOtherPays()
    with ScriptedOpenAIServer(model) as server:
        cfg = tiny_config(
            tmp_path / "runs", ray={"address": ray_cluster.get_runtime_context().gcs_address},
            experience_model={"backend": "http", "url": server.url, "check_reward_rule": False,
                              "inadmissible": "model"},
            learner={"group_size": 4},
            train={"iterations": 2, "warm_start": {"method": "none"}, "checkpoint_every": 0},
            study={"name": "tiny", "arms": ["base", "dreamgym", "copy-sim", "bc"], "seeds": 1, "eval_episodes": 3})
        (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
        study = tmp_path / "runs" / "study-tiny"

        first = _study([str(tmp_path / "study.yaml"), "--arm", "dreamgym"], env)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert first.stdout.count(": start (") == 1 and first.stdout.count(": done in ") == 1, first.stdout
        assert not (study / "copy-sim").exists()
        done = {p: p.stat().st_mtime_ns for p in study.glob("dreamgym/seed-*/summary.json")}
        assert len(done) == 1
        offline_mtime = (study / "offline.parquet").stat().st_mtime_ns
        model_calls = model.calls

        second = _study(["--resume", str(study)], env)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("finished before, skipped") == 1 and second.stdout.count(": done in ") == 3
    assert {p: p.stat().st_mtime_ns for p in done} == done  # finished arm-seeds were not run again
    assert (study / "offline.parquet").stat().st_mtime_ns == offline_mtime  # collected once
    assert model.calls == model_calls  # copy-sim asked no experience model (base and bc need none)
    assert "experience-model replica" not in (study / "copy-sim" / "seed-0" / "train.log").read_text()

    result = json.loads((study / "results.json").read_text())
    arms = {a["arm"]: a for a in result["arms"]}
    assert set(arms) == {"base", "dreamgym", "copy-sim", "bc"}
    assert arms["dreamgym"]["seeds"] == arms["bc"]["seeds"] == arms["copy-sim"]["seeds"] == [0]
    assert result["checks"]["same_learner_step_budget"] and result["checks"]["learner_step_budget"] == [2]
    assert result["checks"]["same_eval_set"] and result["checks"]["eval_sets"][0]["tasks"] == 3
    runs = {(r["arm"], r["seed"]): r for r in result["runs"]}
    assert len(runs) == 4 and all(r["finished"] for r in runs.values())
    assert all(r["run_dir"] == f"{arm}/seed-{seed}" for (arm, seed), r in runs.items())  # inside the study
    r = runs[("dreamgym", 0)]
    assert r["iterations"] == 2 and 1 <= r["learner_steps"] <= 2, r  # synthetic groups had reward variance
    assert r["groups"] >= 1 and r["mixed_group_share"] > 0 and r["reward_success_agreement"] == 1.0, r
    assert runs[("bc", 0)]["learner_steps"] == 2 and runs[("bc", 0)]["iterations"] == 0  # 2 cloning steps, no RL
    # What each arm consumed: offline (expert / other), online real, evaluation, synthetic
    offline = arms["dreamgym"]["offline_real_transitions"]
    assert offline > 0 and arms["copy-sim"]["offline_real_transitions"] == offline
    assert arms["dreamgym"]["offline_expert_transitions"] + arms["dreamgym"]["offline_other_transitions"] == offline
    assert 0 < arms["bc"]["offline_real_transitions"] == arms["bc"]["offline_expert_transitions"] < offline
    assert arms["base"]["offline_real_transitions"] == 0
    assert all(a["online_real_transitions"] == 0 and a["eval_transitions"] > 0 for a in arms.values())
    assert arms["copy-sim"]["synthetic_transitions"] > 0 and arms["bc"]["synthetic_transitions"] == 0
    assert arms["dreamgym"]["rules_would_settle_share"] is not None  # the rules counted while off
    assert arms["dreamgym"]["rules_settled_share"] == 0.0  # inadmissible: model, so they settled nothing
    assert arms["copy-sim"]["rules_first_reply_final_agreement"] in (None, 1.0)  # copying is deterministic
    summary = json.loads((study / "dreamgym" / "seed-0" / "summary.json").read_text())
    assert len(summary["simulator_rules"]["per_iteration"]) == 2 and summary["simulator_rules"]["queries"] > 0
    # Per-episode records: every arm at seed 0 played the same held-out tasks with the same sampling seed
    records = {a: final_records(study / a / "seed-0") for a in arms}
    keys = {a: [(r["task_id"], r["episode"], r["run_seed"], r["sampling_seed"]) for r in rs]
            for a, rs in records.items()}
    assert len(keys["base"]) == 3 and all(k == keys["base"] for k in keys.values()), keys
    assert all({"success", "steps", "unparsable", "invalid_actions", "weight_version", "task_seed"} <= set(r)
               for rs in records.values() for r in rs)
    assert {r["label"] for r in records["base"]} == {"start"} and {r["label"] for r in records["dreamgym"]} == {"final"}
    # base only evaluates: it started no learner (its checkpoint holds the counters, no weights) and no replay buffer
    base_ckpt = sorted((study / "base" / "seed-0" / "checkpoints").glob("step-*"))
    assert [sorted(p.name for p in d.iterdir()) for d in base_ckpt] == [["curriculum.json", "driver.json"]]
    assert not (study / "base" / "seed-0" / "replay").exists() and not (study / "bc" / "seed-0" / "replay").exists()
    # Paired intervals for the pairs the pattern names: 3 held-out episodes of seed 0 in common
    paired = {(p["a"], p["b"]): p for p in result["paired"] if p["scale"] == 1.0}
    for pair in (("dreamgym", "copy-sim"), ("dreamgym", "bc"), ("dreamgym", "base"), ("copy-sim", "base"),
                 ("bc", "base")):
        p = paired[pair]
        assert p["n"] == 3 and p["seeds"] == [0], p
        assert p["ci95"][0] <= p["diff"] <= p["ci95"][1] and 0 <= p["p_mcnemar"] <= 1, p
    assert result["power"]["delta"] == 0.1 and "note" in result["power"] and result["setting"]["env"] == "twx:coin"
    assert result["setting"]["iterations"] == 2 and result["setting"]["base_success"] == arms["base"]["success"]
    claim = next(c for c in result["pattern"] if c["right"] == "copy-sim")
    assert claim["holds"] in (True, False) and claim["paired"]["n"] == 3

    # --export keeps what the results are made of, without weights or checkpoints, and --report rebuilds the same
    # table from it: a study too long for one machine goes on elsewhere from a committed export
    export = tmp_path / "export"
    exported = _study(["--export", str(study), str(export)], env)
    assert exported.returncode == 0 and "exported 4 finished arm-seed(s)" in exported.stdout, exported.stderr[-3000:]
    assert (export / "offline.parquet").is_file() and (export / "study.yaml").is_file()
    assert not list(export.rglob("checkpoints")) and not list(export.rglob("*.safetensors"))
    assert all((export / a / "seed-0" / n).is_file() for a in arms for n in ("summary.json", "eval_episodes.jsonl"))
    for name in ("results.md", "results.json", "success_vs_real.png"):
        (export / name).unlink()
    rebuilt = _study(["--report", str(export)], env)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert (export / "success_vs_real.png").stat().st_size > 0
    again = json.loads((export / "results.json").read_text())
    assert again["arms"] == result["arms"] and again["paired"] == result["paired"]  # seeded bootstrap
    table = (export / "results.md").read_text()
    assert "| dreamgym: DreamGym (synthetic only) | 1 |" in table and "copy-sim" in table
    assert "| dreamgym | copy-sim |" in table and "Power" in table
