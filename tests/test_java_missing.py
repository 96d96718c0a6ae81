"""Without Java, the Java engines fail with one clear message (real subprocesses, PATH stripped)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env_without_java(path_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(path_dir)  # only this folder: no java anywhere on PATH
    env["PYTHONPATH"] = str(REPO)
    return env


def _run(code: str, path_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=_env_without_java(path_dir), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


BUILD = """
from dreamgym.config import EnvConfig
from dreamgym.envs.registry import make_env
from dreamgym.errors import EnvironmentUnavailableError
try:
    env = make_env(EnvConfig(name={name!r}))
    env.reset(env.tasks(1)[0])
except EnvironmentUnavailableError as e:
    print("CLEAR:", e)
    raise SystemExit(3)
"""


@pytest.mark.parametrize(("name", "engine"), [("twx:coin", "TextWorldExpress"), ("sciworld:boil", "ScienceWorld")])
def test_adapter_without_java(tmp_path: Path, name: str, engine: str) -> None:
    p = _run(BUILD.format(name=name), tmp_path, tmp_path)
    assert p.returncode == 3, p.stderr
    assert f"CLEAR: {engine} needs a Java runtime" in p.stdout
    assert "`java` was not on PATH" in p.stdout and "apt-get install -y openjdk-17-jre-headless" in p.stdout
    assert p.stderr == ""  # nothing else: no py4j traceback, no __del__ noise


def test_broken_java_is_one_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'this java is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    p = _run(BUILD.format(name="twx:coin"), tmp_path, tmp_path)
    assert p.returncode == 3, p.stderr
    assert "CLEAR: TextWorldExpress's Java engine did not start" in p.stdout
    assert "AttributeError" not in p.stderr and "Traceback" not in p.stderr


def test_java_home_is_used_when_java_is_not_on_path(tmp_path: Path) -> None:
    from dreamgym.envs.java import find_java

    java = find_java()
    if java is None:
        pytest.skip("no Java on this machine")
    home = Path(os.path.realpath(java)).parent.parent
    env = _env_without_java(tmp_path)
    env["JAVA_HOME"] = str(home)
    code = "from dreamgym.envs.java import require_java; import os; print(require_java('X')); print(os.environ['PATH'])"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    found, path = p.stdout.splitlines()
    assert found == str(home / "bin" / "java") and path.startswith(str(home / "bin"))


def test_cli_collect_without_java(tmp_path: Path) -> None:
    code = "import sys; from dreamgym.cli import main; sys.exit(main())"
    p = subprocess.run(
        [sys.executable, "-c", code, "collect", "--env", "twx:coin", "--episodes", "1",
         "--run.out_dir", str(tmp_path / "runs")],
        env=_env_without_java(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "dreamgym collect: error: TextWorldExpress needs a Java runtime" in p.stderr
    assert "openjdk-17-jre-headless" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()  # failed before creating a run directory
