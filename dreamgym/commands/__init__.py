"""The entry layer's command bodies: what each ``dreamgym`` subcommand does once its arguments are parsed.

``dreamgym.cli`` parses the command line and imports only the body of the subcommand that runs
(``cli.COMMANDS``). A body is ``cmd_<name>(args, overrides) -> exit code``: ``args`` is the parsed
``argparse.Namespace``, ``overrides`` the ``--section.field VALUE`` tokens (the shortcut flags included)
for ``dreamgym.config.load_config``. Heavy imports (Ray, torch, vLLM, the Java engines) stay inside the
bodies, so importing a module here stays cheap.

This layer is where the library (``dreamgym``), the Ray actors (``actors``) and the learner (``learner``)
meet: the library imports neither of the other two, and nothing imports this layer but ``cli``
(import-linter contracts in ``pyproject.toml``).

- ``setup``: ``config``, ``envs``, ``tasks``, ``prepare-models``, ``inspect-data``, ``serve-env`` (the library only);
- ``data``: ``collect``, ``seed-replay`` (Ray actors);
- ``experience``: ``annotate``, ``train-experience-model``, ``eval-experience-model``;
- ``train``: ``train`` (the Ray driver) and ``sft`` (behaviour cloning in this process);
- ``study``: ``study`` (the paper's Table 1: one ``dreamgym train`` subprocess per arm and seed).
"""
