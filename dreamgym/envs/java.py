"""The Java runtime that TextWorldExpress and ScienceWorld run on.

Both engines start a JVM through py4j with the bare command ``java``. Without Java the user sees a
``FileNotFoundError: [Errno 2] No such file or directory: 'java'`` from deep inside py4j's
``subprocess.Popen`` (plus an ``AttributeError`` from the engine's ``__del__`` on the half-built
object). ``require_java`` runs before an engine starts and turns that into one clear message.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, TypeVar

from dreamgym.errors import EnvironmentUnavailableError

INSTALL_HINT = "apt-get install -y openjdk-17-jre-headless"

T = TypeVar("T")


def find_java() -> str | None:
    """Path of a ``java`` executable on ``PATH`` or in ``$JAVA_HOME/bin``, else ``None``."""
    on_path = shutil.which("java")
    if on_path:
        return on_path
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def require_java(engine: str) -> str:
    """Return the ``java`` executable for ``engine``, or raise one clear error saying how to get it.

    When Java is only found through ``$JAVA_HOME``, its ``bin`` folder is put on this process's
    ``PATH``: the engines launch plain ``java`` and would not find it otherwise.
    """
    java = find_java()
    if java is None:
        home = os.environ.get("JAVA_HOME")
        where = f"not on PATH and not in JAVA_HOME/bin (JAVA_HOME={home})" if home else "not on PATH (JAVA_HOME unset)"
        raise EnvironmentUnavailableError(
            f"{engine} needs a Java runtime (17 or newer), but `java` was {where}. "
            f"Install one with `{INSTALL_HINT}` (Debian/Ubuntu), or set JAVA_HOME to an installed JDK/JRE."
        )
    java_bin = str(Path(java).parent)
    if shutil.which("java") is None:
        os.environ["PATH"] = java_bin + os.pathsep + os.environ.get("PATH", "")
    return java


_SAFE_CLASSES: dict[type, type] = {}


def start_engine(engine: str, cls: type[T], **kwargs: Any) -> T:
    """Start a py4j-based engine (``cls(**kwargs)`` launches its JVM) with clear errors.

    The packaged engine classes close their gateway in ``__del__``; when the JVM failed to start
    that ``__del__`` raises an ``AttributeError`` that Python prints as noise after the real error.
    A subclass with a tolerant ``__del__`` is used instead.
    """
    require_java(engine)
    from py4j.protocol import Py4JError

    safe = _SAFE_CLASSES.get(cls)
    if safe is None:

        def __del__(self: Any) -> None:
            if getattr(self, "_gateway", None) is not None:
                with contextlib.suppress(Exception):
                    self.close()

        safe = type(f"_Safe{cls.__name__}", (cls,), {"__del__": __del__})
        _SAFE_CLASSES[cls] = safe
    try:
        return safe(**kwargs)
    except (OSError, ValueError, Py4JError) as e:  # ValueError: the JVM exited before printing its port
        raise EnvironmentUnavailableError(
            f"{engine}'s Java engine did not start ({type(e).__name__}: {e}); check that `java -version` "
            f"works and reports Java 17 or newer (install: `{INSTALL_HINT}`)"
        ) from None


def stop_engine(env: Any) -> None:
    """Close a py4j engine started by ``start_engine`` once (its ``__del__`` then does nothing)."""
    if getattr(env, "_gateway", None) is None:
        return
    try:
        env.close()
    finally:
        env._gateway = None
