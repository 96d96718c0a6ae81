"""The one typed configuration tree.

Loaded from YAML, overridden from the command line with ``--section.field value``, validated as a
whole, and saved resolved into the run directory. Every field carries a docstring (pydantic turns
it into the field description, shown by ``dreamgym config --explain``). Errors name the dotted path
of the field, what was wrong and what is allowed.

Sections are added by the subsystems that own them; each section is a small model here so the whole
tree stays readable in one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dreamgym.errors import ConfigError


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class RunConfig(Section):
    name: str = "dreamgym"
    """Run name; the run directory is ``<out_dir>/<name>-<command>-<timestamp>``."""
    out_dir: Path = Path("runs")
    """Parent folder of run directories."""
    seed: int = 0
    """Global seed for task sampling, scripted policies and training."""


class RayConfig(Section):
    address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``, ``host:6379``). ``None``: use
    ``RAY_ADDRESS`` if set, else start a local single-node Ray."""
    num_cpus: int | None = Field(default=None, ge=1)
    """CPUs for a locally started Ray (``None``: all of this machine's)."""
    log_to_driver: bool = False
    """Forward actor stdout/stderr to the driver's terminal."""


GameParamValue = str | int | float | bool


class EnvConfig(Section):
    name: str = "twx:coin"
    """Environment spec ``family:name``. Families: ``twx`` (TextWorldExpress games: coin, twc,
    cookingworld, mapreader, arithmetic, sorting, ...), ``sciworld`` (ScienceWorld task names),
    ``alfworld`` (``alfworld:/path/to/game.tw-pddl``), ``remote`` (an HTTP environment server,
    see ``url``). ``dreamgym envs`` lists them."""
    params: dict[str, GameParamValue] = Field(default_factory=dict)
    """Game parameters. TextWorldExpress: e.g. ``{numLocations: 3, includeDoors: 0}`` (merged over
    the game's defaults); ScienceWorld: ``{simplifications: easy}``; remote: extra fields sent with
    ``/create``."""
    split: Literal["train", "dev", "test"] = "train"
    """Which task split to draw seeds/variations from (held-out evaluation uses ``test``)."""
    max_steps: int = Field(default=20, ge=1, le=10_000)
    """Step budget per episode; an episode that reaches it ends with ``done`` and no success."""
    admissible_actions: bool = True
    """Ask the environment for the list of valid actions at every step (ScienceWorld: slow)."""
    state_max_chars: int = Field(default=2_000, ge=64)
    """The abstract state is truncated to this many characters after normalisation."""
    url: str | None = None
    """Base URL of an environment server, for ``remote:<name>`` (e.g. ``http://127.0.0.1:36001``)."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Timeout of one request to an environment server."""

    @field_validator("name")
    @classmethod
    def _spec_shape(cls, v: str) -> str:
        if ":" not in v or not v.split(":", 1)[0] or not v.split(":", 1)[1]:
            raise ValueError(f"expected 'family:name' such as 'twx:coin', got {v!r}")
        return v


class CollectConfig(Section):
    policy: Literal["gold", "random", "mixed"] = "random"
    """Behaviour policy: ``gold`` follows the environment's expert plan; ``random`` picks a uniformly
    random admissible action; ``mixed`` plays each episode gold with probability ``gold_fraction``,
    else random."""
    episodes: int = Field(default=200, ge=1)
    """Number of episodes to collect (one task seed each, consecutive from ``first_seed``)."""
    first_seed: int = Field(default=0, ge=0)
    """Seed (or variation index) of the first task."""
    gold_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of gold episodes under the ``mixed`` policy."""
    out: Path | None = None
    """Output Parquet file (default: ``transitions.parquet`` in the run directory)."""
    workers: int | None = Field(default=None, ge=1)
    """Parallel collection actors (``None``: one per CPU of the Ray cluster, at most 8)."""
    episodes_per_batch: int = Field(default=32, ge=1)
    """Episodes an actor runs per request; the driver writes each batch as one Parquet row group."""


class DreamGymConfig(Section):
    """The whole configuration of a DreamGym run."""

    run: RunConfig = Field(default_factory=RunConfig)
    """Run naming, output folder and seed."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """Which Ray cluster to use."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The real environment."""
    collect: CollectConfig = Field(default_factory=CollectConfig)
    """Offline data collection (``dreamgym collect``)."""


# ----------------------------------------------------------------------------------------------
# Loading, overriding, validating, saving


def _format_validation_error(err: ValidationError, root: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            parent = _model_at(root, e["loc"][:-1])
            valid = ", ".join(sorted(parent.model_fields)) if parent else "?"
            lines.append(f"  {path}: unknown key; valid keys here: {valid}")
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"  {path}: {e['msg']}{got_s}")
    return "invalid configuration:\n" + "\n".join(lines)


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ``['--collect.episodes', '10', '--env.name=twx:twc']`` into a nested dict.

    Values are parsed as YAML scalars/collections (``10`` -> int, ``true`` -> bool, ``[1, 2]`` ->
    list, ``null`` -> None) so they reach the validator typed.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise ConfigError(f"unexpected argument {tok!r}: overrides look like --section.field VALUE")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or (args[i + 1].startswith("--") and len(args[i + 1]) > 2):
                raise ConfigError(f"override --{key} has no value: use --{key} VALUE")
            value = args[i + 1]
            i += 1
        i += 1
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        _set_dotted(out, key, parsed)
    return out


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override --{dotted}: {p!r} is not a section")
        d = nxt
    d[parts[-1]] = value


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into a copy of ``base`` (dicts recursively, everything else replaced)."""
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = deep_merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must contain a mapping of sections, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> DreamGymConfig:
    """Load a config: defaults <- YAML file <- command-line overrides, validated as one tree."""
    data = read_yaml(path) if path else {}
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = deep_merge(data, over)
    return validate_config(data)


def validate_config(data: dict[str, Any]) -> DreamGymConfig:
    try:
        return DreamGymConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, DreamGymConfig)) from None


def config_to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def save_config(cfg: BaseModel, path: str | Path) -> Path:
    p = Path(path)
    p.write_text(config_to_yaml(cfg))
    return p


def explain(model: type[BaseModel] = DreamGymConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every leaf field as ``(dotted path, default, description)``."""
    rows: list[tuple[str, str, str]] = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        dotted = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(explain(ann, dotted + "."))
        else:
            default = f.default_factory() if f.default_factory is not None else f.default  # type: ignore[call-arg]
            rows.append((dotted, repr(default), (f.description or "").replace("\n", " ")))
    return rows
