"""Shared fixtures. Real components only: a real local Ray cluster, real engines, real files."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


#: Fixtures that start a Ray cluster: a test using one (directly or through another fixture) is marked ``ray``.
RAY_FIXTURES = frozenset({"ray_cluster", "ray_head"})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


# ---------------------------------------------------------------------------------------------
# The inner loop's guard: a run that deselects ``ray`` or ``engine`` (``make test-fast`` deselects both) fails
# any test that starts one anyway, in this process or in a subprocess, so an unmarked test cannot slip in.

#: Substrings of a process command line that mean a Ray cluster / a vLLM engine is running, by marker.
HEAVY_PROCESSES = {"ray": ("raylet", "gcs_server", "ray start"),
                   "engine": ("vllm.entrypoints", "vllm serve", "EngineCore")}


def _deselected(config: pytest.Config) -> set[str]:
    """The markers of ``HEAVY_PROCESSES`` that this run's ``-m`` expression excludes (``not ray``)."""
    expr = config.getoption("markexpr") or ""
    return {m for m in HEAVY_PROCESSES if re.search(rf"\bnot\s+{m}\b", expr)}


class _ProcessWatch:
    """Samples this process's descendants; remembers the heavy ones (pid -> what matched) not reported yet."""

    def __init__(self, patterns: tuple[str, ...], interval_s: float = 0.2) -> None:
        import psutil

        self.me = psutil.Process()
        self.patterns = patterns
        self.new: dict[int, str] = {}
        self._reported: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name="heavy-process-watch",
                                        daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        import psutil

        while not self._stop.wait(interval_s):
            try:
                children = self.me.children(recursive=True)
            except psutil.Error:
                continue
            for c in children:
                if c.pid in self._reported or c.pid in self.new:
                    continue
                try:
                    cmd = " ".join(c.cmdline()) or c.name()
                except psutil.Error:
                    continue
                hit = next((h for h in self.patterns if h in cmd), None)
                if hit:
                    with self._lock:
                        self.new[c.pid] = f"{hit} (pid {c.pid})"

    def take(self) -> list[str]:
        with self._lock:
            found, self.new = self.new, {}
            self._reported |= set(found)
        return sorted(found.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def _heavy_process_watch(request: pytest.FixtureRequest) -> Iterator[tuple[set[str], _ProcessWatch | None]]:
    off = _deselected(request.config)
    if not off:
        yield off, None
        return
    watch = _ProcessWatch(tuple(p for m in sorted(off) for p in HEAVY_PROCESSES[m]))
    yield off, watch
    watch.stop()


def _in_process() -> dict[str, bool]:
    """Whether Ray is initialised / vLLM is imported in this process."""
    ray = sys.modules.get("ray")
    return {"ray": bool(ray is not None and ray.is_initialized()), "engine": "vllm" in sys.modules}


@pytest.fixture(autouse=True)
def _no_ray_or_engine_when_deselected(
    _heavy_process_watch: tuple[set[str], _ProcessWatch | None],
) -> Iterator[None]:
    off, watch = _heavy_process_watch
    before = _in_process()
    yield
    if watch is None:
        return
    after = _in_process()
    what = {"ray": "Ray was initialised in this process", "engine": "vLLM was imported in this process"}
    problems = [what[m] for m in sorted(off) if after[m] and not before[m]]
    if found := watch.take():
        problems.append("processes started: " + ", ".join(found))
    if problems:
        pytest.fail(f"this run deselects the markers {sorted(off)}, but this test started what they mark; mark it: "
                    + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real single-node Ray cluster started for the test session (2 CPUs, no dashboard)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # address="local": always a fresh cluster of our own, even when RAY_ADDRESS or another Ray is around.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             namespace="dreamgym-tests")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def alfworld_debug_dir() -> Path:
    d = SHARED_DATA / "alfworld-debug"
    if not (d / "game.tw-pddl").is_file():
        pytest.fail(f"the ALFWorld debug game is missing at {d} (it ships in the data folder beside the repository)")
    return d


@pytest.fixture
def java_available() -> bool:
    return shutil.which("java") is not None
