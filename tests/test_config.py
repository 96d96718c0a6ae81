"""The config tree: YAML + overrides, validation messages with dotted paths, saving, docs."""

from __future__ import annotations

import pytest
import yaml

from dreamgym.config import DreamGymConfig, explain, load_config, parse_overrides, save_config
from dreamgym.errors import ConfigError


def test_defaults_load_and_are_documented() -> None:
    cfg = load_config()
    assert cfg.env.name == "twx:coin"
    rows = explain()
    assert len(rows) > 10
    undocumented = [path for path, _, desc in rows if not desc.strip()]
    assert undocumented == []


def test_yaml_then_overrides(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("env:\n  name: twx:twc\n  max_steps: 30\ncollect:\n  episodes: 5\n")
    cfg = load_config(p, ["--collect.episodes", "7", "--env.params.numLocations=2", "--run.name", "x"])
    assert cfg.env.name == "twx:twc"
    assert cfg.env.max_steps == 30
    assert cfg.collect.episodes == 7
    assert cfg.env.params == {"numLocations": 2}
    assert cfg.run.name == "x"


def test_override_values_are_typed() -> None:
    assert parse_overrides(["--a.b", "3", "--a.c", "true", "--d", "[1, 2]", "--e", "null"]) == {
        "a": {"b": 3, "c": True}, "d": [1, 2], "e": None,
    }


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["--collect.episodes", "-3"], "collect.episodes: Input should be greater than or equal to 0"),
        (["--collect.episodes", "many"], "collect.episodes: Input should be a valid integer"),
        (["--collect.policy", "clever"], "collect.policy: Input should be 'gold', 'random' or 'mixed'"),
        (["--collect.gold_fraction", "1.5"], "collect.gold_fraction"),
        (["--env.name", "coin"], "env.name: Value error, expected 'family:name'"),
        (["--env.max_stepz", "3"], "env.max_stepz: unknown key; valid keys here: admissible_actions"),
        (["--nosection.x", "3"], "nosection: unknown key; valid keys here: collect, curriculum, env"),
    ],
)
def test_bad_values_name_the_field_and_reason(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert fragment in str(e.value)


def test_bad_yaml_and_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must contain a mapping"):
        load_config(lst)


def test_a_config_extends_another_and_states_only_what_differs(tmp_path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "root.yaml").write_text(
        "env:\n  name: twx:coin\n  params: {numLocations: 3, includeDoors: 0}\n  max_steps: 10\n"
        "curriculum:\n  tasks_per_iteration: 2\n")
    (tmp_path / "base" / "mid.yaml").write_text("extends: root.yaml\ncurriculum:\n  tasks_per_iteration: 4\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base/mid.yaml\nenv:\n  params: {numLocations: 5}\n")
    cfg = load_config(child, ["--env.max_steps", "12"])
    assert cfg.env.name == "twx:coin" and cfg.env.max_steps == 12  # from the root, then the command line
    assert cfg.curriculum.tasks_per_iteration == 4  # the middle file over the root
    assert cfg.env.params == {"numLocations": 5, "includeDoors": 0}  # mappings merge key by key


def test_a_bad_extends_names_the_file(tmp_path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("extends: b.yaml\n")
    b.write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"'extends' goes round in a circle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config(a)
    a.write_text("extends: missing.yaml\n")
    with pytest.raises(ConfigError, match=r"config file not found: .*missing\.yaml \(extended by .*a\.yaml\)"):
        load_config(a)
    a.write_text("extends: [b.yaml]\n")
    with pytest.raises(ConfigError, match="'extends' must be the path of one YAML file"):
        load_config(a)


def test_the_5_room_study_config_extends_the_3_room_one() -> None:
    from pathlib import Path

    configs = Path(__file__).parent.parent / "configs"
    coin5 = load_config(configs / "study-coin5-cpu.yaml")
    coin3 = load_config(configs / "study-cpu.yaml")
    assert "extends: study-cpu.yaml" in (configs / "study-coin5-cpu.yaml").read_text()
    assert coin5.env.params == {"numLocations": 5, "includeDoors": 0} and coin5.train.iterations == 10
    assert coin5.experience_model.train == coin3.experience_model.train and coin5.learner == coin3.learner


def test_override_without_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no value"):
        parse_overrides(["--collect.episodes"])
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_overrides(["episodes"])


def test_saved_config_round_trips(tmp_path) -> None:
    cfg = load_config(None, ["--collect.episodes", "11", "--env.params.numLocations", "4"])
    path = save_config(cfg, tmp_path / "config.yaml")
    again = load_config(path)
    assert again == cfg
    assert yaml.safe_load(path.read_text())["collect"]["episodes"] == 11
    assert isinstance(again, DreamGymConfig)


def test_engine_section_is_shared_and_keeps_role_defaults() -> None:
    """One ``EngineConfig`` for policy engines and experience-model replicas; setting one field of a role's
    engine keeps that role's other defaults (the experience model serves bf16 with a 4k context)."""
    cfg = load_config(None, ["--experience_model.engine.kv_cache_gib", "0.5", "--policy.engine.seed", "3"])
    em, pol = cfg.experience_model.engine, cfg.policy.engine
    assert type(em) is type(pol)
    assert (em.kv_cache_gib, em.dtype, em.max_model_len, em.gpu_memory_utilization) == (0.5, "bfloat16", 4096, 0.85)
    assert (pol.seed, pol.dtype, pol.max_model_len) == (3, "float32", 2048)
    assert em.gpus() == 0.0 and pol.model_copy(update={"device": "cuda"}).gpus() == 1.0


def test_train_sections_split_by_concern() -> None:
    cfg = load_config(None, ["--train.eval.tasks", "32", "--train.rollout.workers", "2", "--learner.threads", "1",
                             "--train.warm_start.method", "sft", "--train.report.markdown", "false"])
    t = cfg.train
    assert (t.eval.tasks, t.rollout.workers, cfg.learner.threads, t.warm_start.method, t.report.markdown) == (
        32, 2, 1, "sft", False)


def test_moved_keys_still_load_with_a_note(tmp_path, capsys) -> None:
    """Configs and run directories of earlier versions keep working: each moved key is read at its new place."""
    p = tmp_path / "old.yaml"
    p.write_text("policy:\n  dtype: bfloat16\n  enable_prefix_caching: false\nexperience_model:\n  engine_seed: 4\n"
                 "  num_gpus: 1\ntrain:\n  eval_tasks: 8\n  warm_start: sft\n  sft_steps: 3\n  report: false\n"
                 "  learner_threads: 1\n")
    cfg = load_config(p)
    assert cfg.policy.engine.dtype == "bfloat16" and cfg.policy.engine.prefix_caching is False
    assert cfg.experience_model.engine.seed == 4 and cfg.experience_model.engine.device == "cuda"
    assert (cfg.train.eval.tasks, cfg.train.warm_start.method, cfg.train.warm_start.steps) == (8, "sft", 3)
    assert cfg.train.report.markdown is False and cfg.learner.threads == 1
    err = capsys.readouterr().err
    assert "train.eval_tasks is now train.eval.tasks" in err and "policy.dtype is now policy.engine.dtype" in err


def test_a_key_set_under_old_and_new_name_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train\.eval_tasks and train\.eval\.tasks are both set"):
        load_config(None, {"train": {"eval_tasks": 4, "eval": {"tasks": 8}}})


def test_zero_episodes_means_no_offline_data_for_train_but_collect_refuses_it() -> None:
    """``collect.episodes: 0`` lets real-mode ``dreamgym train`` start with no offline data (servers that reveal
    no valid actions have nothing to collect); ``dreamgym collect`` itself refuses it before starting Ray."""
    from actors.collect import run_collect

    cfg = load_config(None, ["--collect.episodes", "0", "--train.mode", "real"])
    assert cfg.collect.episodes == 0
    with pytest.raises(ConfigError, match=r"collect\.episodes is 0: nothing to collect"):
        run_collect(cfg)


def test_synthesis_without_offline_data_is_refused_with_the_fix(tmp_path) -> None:
    from actors.train_setup import offline_data

    notes: list[str] = []
    real = load_config(None, ["--collect.episodes", "0", "--train.mode", "real"])
    assert offline_data(real, tmp_path, notes.append) is None and "starts empty" in notes[0]
    synthetic = load_config(None, ["--collect.episodes", "0", "--train.mode", "synthetic"])
    with pytest.raises(ConfigError, match=r"synthetic iterations need offline real data"):
        offline_data(synthetic, tmp_path, notes.append)
