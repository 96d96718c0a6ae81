"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

The reference pages for the config and the command line are generated from the code at every build
(``dreamgym.reference``), so they cannot drift from ``dreamgym/config.py`` and ``dreamgym/cli.py``; nothing
generated is committed.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    from dreamgym.cli import build_parser
    from dreamgym.reference import cli_reference, config_reference

    pages = {"reference/config.md": config_reference(), "reference/cli.md": cli_reference(build_parser())}
    for uri, content in pages.items():
        if files.get_file_from_path(uri) is not None:
            raise SystemExit(f"docs/{uri} is generated at build time by dreamgym.reference: delete the file")
        files.append(File.generated(config, uri, content=content))
    return files
