"""Real AgentGym environment servers (TextCraft, ScienceWorld, BabyAI) as subprocesses on loopback, for tests.

The servers are AgentGym's ``agentenv-*`` packages, run from their source folders (no install needed):
``DREAMGYM_AGENTGYM_DIR`` names the folder holding ``agentenv-textcraft/``, ``agentenv-sciworld/`` and
``agentenv-babyai/`` (a checkout of the AgentGym repository works). Each server runs under
``DREAMGYM_AGENTGYM_PYTHON_<NAME>`` (e.g. ``..._BABYAI``), else ``DREAMGYM_AGENTGYM_PYTHON``, else this
interpreter; the project's environment has what TextCraft and ScienceWorld import, BabyAI needs ``gym``
and ``minigrid<2.5`` in a separate one. A test skips, saying why, where the folder or the server's
imports are missing.

``AgentGymServer`` starts one on a free port, waits for ``GET /`` within a bound, and stops it by its
process id (``restart`` keeps the port: a restarted server hands out environment ids from 0 again).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

HOST = "127.0.0.1"

#: name -> (package folder, module, modules the server imports, seconds to wait for it)
SERVERS = {
    "textcraft": ("agentenv-textcraft", "agentenv_textcraft", ("fastapi", "uvicorn", "gymnasium"), 60),
    "sciworld": ("agentenv-sciworld", "agentenv_sciworld", ("fastapi", "uvicorn", "scienceworld"), 120),
    "babyai": ("agentenv-babyai", "agentenv_babyai", ("fastapi", "uvicorn", "gym", "minigrid"), 120),
}


def agentgym_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / "shared" / "agentgym-servers"
    return Path(os.environ.get("DREAMGYM_AGENTGYM_DIR") or default)


#: Servers whose dependencies clash with the project's (BabyAI needs gym and gymnasium<1.0) run from their own
#: environment, which ``scripts/install.sh`` makes at ``.venv-<name>/``.
OWN_VENV = {"babyai": Path(__file__).resolve().parents[1] / ".venv-babyai" / "bin" / "python"}


def server_python(name: str) -> str:
    own = OWN_VENV.get(name)
    return (os.environ.get(f"DREAMGYM_AGENTGYM_PYTHON_{name.upper()}") or os.environ.get("DREAMGYM_AGENTGYM_PYTHON")
            or (str(own) if own is not None and own.is_file() else sys.executable))


def skip_reason(name: str) -> str | None:
    """Why the ``name`` server cannot run here (``None``: it can)."""
    folder, _, imports, _ = SERVERS[name]
    where = agentgym_dir() / folder
    if not where.is_dir():
        return (f"AgentGym's {folder} server is not at {where} (set DREAMGYM_AGENTGYM_DIR to a folder holding "
                "agentenv-textcraft/, agentenv-sciworld/, agentenv-babyai/, e.g. an AgentGym checkout)")
    python = server_python(name)
    probe = subprocess.run([python, "-c", f"import {', '.join(imports)}"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return (f"the {name} server needs {', '.join(imports)} in {python} ({last}); point "
                f"DREAMGYM_AGENTGYM_PYTHON_{name.upper()} at a Python that has them")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class AgentGymServer:
    """One AgentGym server subprocess; ``url`` is its base URL."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.folder, self.module, _, self.wait_s = SERVERS[name]
        self.cwd = agentgym_dir() / self.folder
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log = log_dir / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentGymServer:
        code = f"import sys; sys.path.insert(0, '.'); from {self.module} import launch; launch()"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        with self.log.open("a") as out:
            # From the package folder: TextCraft reads its recipes by a relative path.
            self.proc = subprocess.Popen([server_python(self.name), "-c", code, "--host", HOST, "--port",
                                          str(self.port)], cwd=self.cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.wait_s
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the {self.name} server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(self.url + "/", timeout=2).ok:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the {self.name} server did not answer within {self.wait_s} s:\n{self.tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop this server (its process only, by pid; its children, e.g. ScienceWorld's JVMs, end with it)."""
        if self.proc is None:
            return
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port: the new server knows no environment."""
        self.stop()
        self.start()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    # -- what the server holds ------------------------------------------------------------------
    def live_envs(self, max_id: int = 64) -> list[int]:
        """Ids of the server-side environments that are open (not closed): ``GET /observation`` answers
        for them ("has finished" counts as open: ScienceWorld says so for an ended episode)."""
        alive = []
        for i in range(max_id):
            reply = requests.get(self.url + "/observation", params={"id": i}, timeout=10).json()
            error = reply.get("error", "") if isinstance(reply, dict) else ""
            if not error or "has finished" in error:
                alive.append(i)
        return alive

    def java_processes(self, expect: int | None = None, wait_s: float = 20.0) -> int:
        """ScienceWorld: one JVM per open environment, children of the server process. With ``expect``, waits
        up to ``wait_s`` for that many (a closed environment's JVM takes a moment to exit)."""
        import psutil

        assert self.proc is not None
        deadline = time.monotonic() + wait_s
        while True:
            n = sum(1 for c in psutil.Process(self.proc.pid).children(recursive=True) if "java" in c.name())
            if expect is None or n == expect or time.monotonic() > deadline:
                return n
            time.sleep(0.2)


def start_server(name: str, log_dir: Path) -> AgentGymServer:
    """Start ``name``'s server, or skip the test with the reason it cannot run here."""
    reason = skip_reason(name)
    if reason:
        pytest.skip(reason)
    return AgentGymServer(name, log_dir).start()
