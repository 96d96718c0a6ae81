"""What a process is waiting on right now, for the status line and the hang watchdog (``train.watchdog``).

A rollout worker waits on policy engines and experience-model replicas from several threads at once; each wait
registers here (``with waits.waiting("policy-engine-0 act (8 turns)"):``) and ``longest()`` names the oldest
one with its age. The worker's ``progress`` reports it, so the driver's status line says what a slow iteration
is waiting for, and for how long, instead of only that it runs. No Ray here: the module is plain bookkeeping.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Waits:
    """The calls in flight now, each with what is waited for and since when (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._now: dict[int, tuple[str, float]] = {}

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Register the wait for the duration of the ``with`` block."""
        key = next(self._ids)
        with self._lock:
            self._now[key] = (what, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._now.pop(key, None)

    def longest(self) -> tuple[str, float] | None:
        """The oldest wait in flight and its age in seconds (``None`` when nothing is waited on)."""
        with self._lock:
            if not self._now:
                return None
            what, since = min(self._now.values(), key=lambda w: w[1])
        return what, time.monotonic() - since


def hung_message(what: str, bound_s: float, field: str) -> str:
    """The one line that reports a call past its bound: the actor and call, the bound and its config field."""
    return (f"{what} made no progress within {bound_s:.0f} s ({field}): the actor is alive but stuck (a frozen "
            "process, a GPU kernel that never returns, a node behind a network partition)")
