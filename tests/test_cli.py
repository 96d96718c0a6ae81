"""The dreamgym command: fast help, clear errors (exit 2, no traceback), resolved config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

DREAMGYM = str(Path(sys.executable).with_name("dreamgym"))
HEAVY = ("torch", "vllm", "ray", "transformers", "qdrant_client", "pyarrow", "textworld_express")


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from dreamgym.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_subcommands() -> None:
    out = subprocess.run([DREAMGYM, "--help"], capture_output=True, text=True, check=True).stdout
    for sub in ("collect", "serve-env", "envs", "config"):
        assert sub in out


def test_config_prints_resolved_yaml_with_overrides() -> None:
    out = subprocess.run([DREAMGYM, "config", "--env", "twx:twc", "--collect.episodes", "9"],
                         capture_output=True, text=True, check=True).stdout
    data = yaml.safe_load(out)
    assert data["env"]["name"] == "twx:twc" and data["collect"]["episodes"] == 9


def test_bad_override_is_one_clear_line_not_a_traceback() -> None:
    r = subprocess.run([DREAMGYM, "config", "--collect.episodes", "zero"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "collect.episodes: Input should be a valid integer" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_env_family_lists_valid_ones(tmp_path) -> None:
    r = subprocess.run([DREAMGYM, "collect", "--env", "gym:cartpole", "--run.out_dir", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "unknown environment family 'gym'" in r.stderr and "twx" in r.stderr
    assert "Traceback" not in r.stderr
