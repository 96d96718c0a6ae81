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
        (["--collect.episodes", "-3"], "collect.episodes: Input should be greater than or equal to 1"),
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
