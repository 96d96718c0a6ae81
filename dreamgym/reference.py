"""The documentation site's reference pages, generated from the code so they cannot drift from it.

- :func:`config_reference`: every field of the typed config tree (``dreamgym.config.DreamGymConfig``) with its
  dotted name, type, default and description (the field's docstring), one table per section;
- :func:`cli_reference`: every ``dreamgym`` subcommand with its usage, help and options, from the argparse parser
  (``dreamgym.cli.build_parser``);
- :func:`undocumented_fields`: the fields without a description (a test keeps it empty).

The MkDocs hook ``scripts/mkdocs_hooks.py`` adds both pages to the site at build time (nothing generated is
committed).
"""

from __future__ import annotations

import argparse
import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from dreamgym.config import DreamGymConfig

#: Marks the generated pages (the hook and the tests look for it).
GENERATED_NOTE = "Generated at build time from the code; do not edit."


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def type_name(tp: Any) -> str:
    """A field's annotation as a reader writes it: ``int``, ``str | None``, ``"grpo" | "ppo"``, ``list[int]``."""
    origin = get_origin(tp)
    if tp is type(None):
        return "None"
    if origin is typing.Annotated:
        return type_name(get_args(tp)[0])
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin is not None:
        args = get_args(tp)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if tp is Any:
        return "any"
    if isinstance(tp, type):
        if issubclass(tp, Path):
            return "path"
        if issubclass(tp, SecretStr):
            return "secret"
        return tp.__name__
    return str(tp).replace("typing.", "")


_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "<="),
           (annotated_types.Lt, "lt", "<"))


def constraints(f: FieldInfo) -> str:
    """The field's numeric bounds and pattern, e.g. ``>= 1, <= 10000``."""
    out = []
    for m in f.metadata:
        for cls, attr, sym in _BOUNDS:
            if isinstance(m, cls):
                out.append(f"{sym} {getattr(m, attr)}")
        pattern = getattr(m, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"matches `{pattern}`")
    return ", ".join(out)


def _default(f: FieldInfo) -> Any:
    return f.default_factory() if f.default_factory is not None else f.default  # type: ignore[call-arg]


def default_text(value: Any) -> str:
    """A default as YAML writes it (``null``, ``true``, ``"twx:coin"``, ``[0, 1]``)."""
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value, default=str)


def walk(model: type[BaseModel] = DreamGymConfig, prefix: str = "",
         instance: BaseModel | None = None) -> Iterator[tuple[str, type[BaseModel], BaseModel | None]]:
    """Every section of the tree, depth first, as ``(dotted path, model, its default instance)``; the root is
    ``("", DreamGymConfig, DreamGymConfig())``. The instance carries a section's role defaults (``policy.engine``
    and ``experience_model.engine`` are one ``EngineConfig`` with other defaults each). A model reached only
    through a union (``train.eval.env: EnvConfig | None``) is documented at its own section."""
    if instance is None and not prefix:
        instance = model()
    yield prefix.rstrip("."), model, instance
    for name, f in model.model_fields.items():
        if _is_model(f.annotation):
            sub = getattr(instance, name) if instance is not None else _default(f)
            yield from walk(f.annotation, f"{prefix}{name}.", sub if isinstance(sub, BaseModel) else None)


def _models_in(tp: Any) -> Iterator[type[BaseModel]]:
    if _is_model(tp):
        yield tp
    for a in get_args(tp):
        yield from _models_in(a)


def all_fields(model: type[BaseModel] = DreamGymConfig, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every field of every model reachable from ``model`` (sections and models inside unions or lists)."""
    for name, f in model.model_fields.items():
        dotted = f"{prefix}{name}"
        yield dotted, f
        for sub in _models_in(f.annotation):
            yield from all_fields(sub, dotted + ".")


def undocumented_fields(model: type[BaseModel] = DreamGymConfig) -> list[str]:
    """Dotted names of the config fields without a description (a docstring under the field)."""
    return [name for name, f in all_fields(model) if not (f.description or "").strip()]


_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, ``|`` and ``<``/``>`` escaped outside code spans, and
    reStructuredText's double backticks kept as code."""
    def prose(t: str) -> str:
        return t.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")

    text = " ".join(text.split())
    parts, last = [], 0
    for m in _CODE.finditer(text):
        parts.append(prose(text[last:m.start()]))
        parts.append("`" + m.group(2).strip() + "`")  # Python-Markdown's tables keep a code span's pipes
        last = m.end()
    parts.append(prose(text[last:]))
    return "".join(parts)


def _anchor(dotted: str) -> str:
    return dotted.replace(".", "-").replace("_", "-") or "root"


def config_reference() -> str:
    """The configuration reference page (Markdown)."""
    lines = ["# Configuration reference", "",
             f"<!-- {GENERATED_NOTE} Source: dreamgym/config.py (dreamgym.reference.config_reference). -->", "",
             "Every field of the one typed config tree, `dreamgym/config.py`, generated from the code at build time. "
             "Set a field in a YAML file (`section: {field: value}`) or on the command line "
             "(`--section.field VALUE`); `dreamgym config [CONFIG] --explain` prints the same list in a terminal. "
             "A YAML file may begin with `extends: other.yaml` (a path relative to the file) and state only what "
             "differs: it is merged over that file, mappings key by key, lists and scalars replaced. "
             "Keys of earlier versions still load at their new place (`MOVED_KEYS` in `dreamgym/config.py`).", ""]
    sections = list(walk())
    lines += ["Sections: " + ", ".join(f"[`{p}`](#{_anchor(p)})" for p, _, _ in sections if p), ""]
    for path, model, instance in sections:
        leaves = [(n, f) for n, f in model.model_fields.items() if not _is_model(f.annotation)]
        subs = [(n, f) for n, f in model.model_fields.items() if _is_model(f.annotation)]
        title = f"`{path}`" if path else "The whole tree"
        lines += [f"## {title} {{#{_anchor(path)}}}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("Base for", "!!! abstract")) and model.__doc__ != BaseModel.__doc__:
            lines += [_cell(doc), ""]
        if subs:
            lines += ["Subsections: " + ", ".join(
                f"[`{path + '.' if path else ''}{n}`](#{_anchor(f'{path}.{n}' if path else n)}) "
                f"({_cell(f.description or '')})" for n, f in subs), ""]
        if leaves:
            lines += ["| field | type | default | description |", "|---|---|---|---|"]
            for n, f in leaves:
                bounds = constraints(f)
                tp = _cell(f"`{type_name(f.annotation)}`") + (f" ({_cell(bounds)})" if bounds else "")
                value = getattr(instance, n) if instance is not None else _default(f)
                lines.append(f"| `{path + '.' if path else ''}{n}` | {tp} | `{default_text(value)}` | "
                             f"{_cell(f.description or '')} |")
            lines.append("")
    return "\n".join(lines)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (helps.get(name, ""), p) for name, p in action.choices.items()}
    return {}


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """The command-line reference page (Markdown) of ``parser``: ``dreamgym.cli.build_parser()``, passed in by the
    caller (the entry layer is imported by nothing in the library)."""
    subs = _subparsers(parser)
    lines = ["# Command-line reference", "",
             f"<!-- {GENERATED_NOTE} Source: dreamgym/cli.py (dreamgym.reference.cli_reference). -->", "",
             "Generated from the argument parser (`dreamgym/cli.py`) at build time; `dreamgym COMMAND --help` "
             "prints the same. Every command that takes a `CONFIG` also takes `--section.field VALUE` overrides of "
             "any [config field](config.md) (`--env.params.numLocations 5`, `--ray.address auto`); a config error "
             "names the field, e.g. `collect.episodes: Input should be greater than or equal to 0 (got -3)`.", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [`dreamgym {n}`](#dreamgym-{n}) | {_cell(h)} |" for n, (h, _) in subs.items()]
    lines.append("")
    for name, (help_text, p) in subs.items():
        p.prog = f"dreamgym {name}"
        usage = " ".join(p.format_usage().split()).removeprefix("usage: ")
        lines += [f"## `dreamgym {name}` {{#dreamgym-{name}}}", "", _cell(help_text), "", "```", usage, "```", ""]
        rows = []
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            flag = ", ".join(a.option_strings) if a.option_strings else (a.metavar or a.dest)
            rows.append(f"| `{flag}` | {_cell(a.help or '')} |")
        if rows:
            lines += ["| argument | meaning |", "|---|---|", *rows, ""]
    return "\n".join(lines)


