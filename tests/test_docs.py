"""The documentation site's generated reference (``dreamgym.reference``) and the rules the docs keep.

Fast, no Ray: the site itself is built by ``make test`` (``mkdocs build --strict``, before pytest).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dreamgym.cli import COMMANDS, build_parser
from dreamgym.config import Section, explain
from dreamgym.reference import cli_reference, config_reference, type_name, undocumented_fields

REPO = Path(__file__).resolve().parents[1]


def test_every_config_field_has_a_description() -> None:
    missing = undocumented_fields()
    assert not missing, (f"config fields without a description (add a docstring under each in dreamgym/config.py; "
                         f"the generated reference and `dreamgym config --explain` show it): {missing}")


def test_the_description_check_finds_a_field_without_one() -> None:
    class Inner(Section):
        documented: int = 1
        """Has one."""
        bare: int = 2

    class Outer(Section):
        inner: Inner | None = None
        """A section reached through a union."""

    assert undocumented_fields(Outer) == ["inner.bare"]


def test_the_config_reference_lists_every_field_with_its_type_and_default() -> None:
    page = config_reference()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if line.startswith("| `")}
    for dotted, _, _ in explain():
        assert dotted in rows, f"{dotted} missing from the config reference"
    assert rows["train.mode"].startswith('| `train.mode` | `"synthetic" | "real" | "s2r"` | `"s2r"` |')
    assert "(&gt;= 1)" in rows["collect.workers"] and "`null`" in rows["collect.workers"]
    assert type_name(list[int]) == "list[int]"
    # one EngineConfig, each role's own defaults (the policy engine and the experience-model replica)
    assert '| `"float32"` |' in rows["policy.engine.dtype"]
    assert '| `"bfloat16"` |' in rows["experience_model.engine.dtype"]
    explained = {dotted: default for dotted, default, _ in explain()}  # `dreamgym config --explain` likewise
    assert (explained["policy.engine.dtype"], explained["experience_model.engine.dtype"]) == ("'float32'", "'bfloat16'")


def test_the_cli_reference_lists_every_command_and_its_options() -> None:
    page = cli_reference(build_parser())
    for command in COMMANDS:
        assert f"## `dreamgym {command}`" in page
    train = page.split("## `dreamgym train`")[1].split("\n## ")[0]
    assert "`--dry-run`" in train and "`--resume`" in train and "usage: " not in train


def test_no_file_points_into_a_folder_beside_the_repository() -> None:
    """A path into a folder beside the repository is a broken reference in any other clone of it."""
    needle = ".." + "/shared"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for rel in tracked:
        path = REPO / rel
        if path.suffix in {".png", ".parquet", ".gz", ".jar"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        hits += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert not hits, hits
