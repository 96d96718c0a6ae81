"""The package boundaries: no import cycle between modules, and the import-linter contracts of pyproject.toml.

Static (the import graph is read from the source; nothing is imported or started), so it takes about a second.
Imports inside functions and under ``if TYPE_CHECKING:`` count.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dreamgym", "actors", "learner")


def find_cycle(graph: grimp.ImportGraph, modules: set[str]) -> list[str] | None:
    """One import cycle among ``modules`` (``[a, b, ..., a]``), or None: an iterative depth-first search
    that reports the first edge back to a module still on the path."""
    done: set[str] = set()
    for root in sorted(modules):
        if root in done:
            continue
        path = [root]
        on_path = {root}
        todo = [iter(sorted(graph.find_modules_directly_imported_by(root) & modules))]
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                todo.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                todo.append(iter(sorted(graph.find_modules_directly_imported_by(nxt) & modules)))
    return None


def test_find_cycle_reports_the_cycle() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.b"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert find_cycle(graph, set(graph.modules)) == ["p.b", "p.c", "p.b"]
    graph.remove_import(importer="p.c", imported="p.b")
    assert find_cycle(graph, set(graph.modules)) is None


def test_no_import_cycle_between_modules() -> None:
    graph = grimp.build_graph(*PACKAGES)
    cycle = find_cycle(graph, set(graph.modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_import_linter_contracts() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_command_has_its_body() -> None:
    from dreamgym.cli import COMMANDS, build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(COMMANDS) == set(subparsers.choices)
    for target in COMMANDS.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target
