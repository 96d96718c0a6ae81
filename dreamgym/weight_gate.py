"""Pause -> update -> resume: a weight update is atomic with respect to generation on one policy engine.

With ``train.max_staleness >= 1`` the next iteration's rollouts sample while the learner syncs. A sync is a
transaction of several engine calls (vLLM's weight-transfer protocol: ``start_weight_update``, one
``update_weights`` per chunk, ``finish_weight_update``); between start and finish the engine's layers are
half-loaded (vLLM's layerwise reload moves them to the meta device and fills them as chunks arrive). A sample
drawn then would come from no version at all. ``UpdateGate`` is the engine's guard, the same for every
sync path (object store on CPU, NCCL on GPU), as vLLM's ``pause_generation(mode="wait")`` /
``resume_generation`` are for its async engine and verl, OpenRLHF and SkyRL pause their rollout engines
around a sync:

- ``begin`` pauses: new generation calls wait, and the update starts once the generation in flight has
  finished (those samples are all-old, tagged with the old version);
- generation calls that arrive while an update is open wait until it finishes and then run on the new weights,
  bounded by the update's own deadline and by the caller's ``wait_s`` (``train.watchdog.engine_s``): past
  either they raise ``WeightUpdateStalledError`` naming the engine, the update and the bound;
- one update at a time, identified by its transaction id: an ``update_weights``/``finish`` carrying another id
  (an interleaved or a stale transaction) is refused;
- an update that failed after it touched the weights leaves the engine *incomplete*: generation is refused, with
  the cause, until a later update finishes (the run's fault handling restarts the engines).

Plain threading, no Ray, no vLLM: the engine actor (``actors.policy_engine``) runs generation and weight calls
on separate threads and brackets them with this gate.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dreamgym.errors import EngineAsleepError, WeightUpdateStalledError

#: Deadline of an update whose caller gave none (``learner.sync_timeout_s``'s default).
DEFAULT_UPDATE_TIMEOUT_S = 300.0


@dataclass
class Update:
    """One open update transaction."""

    transaction: str
    what: str
    """What it does, for messages (``weights v7``, ``NCCL rendezvous``)."""
    started: float
    """``time.monotonic()`` when it began (after the generation in flight finished)."""
    deadline: float
    timeout_s: float
    touches_weights: bool
    """False for calls that pause generation without changing weights (the NCCL rendezvous)."""


class UpdateGate:
    """Generation calls and weight-update transactions of one engine, mutually exclusive (thread-safe)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cv = threading.Condition()
        self._generating = 0
        self._open: Update | None = None
        self._incomplete: str | None = None
        self._asleep: tuple[str, float] | None = None
        self._ids = itertools.count(1)

    # -- generation --------------------------------------------------------------------------------
    @contextmanager
    def generating(self, what: str = "generation", wait_s: float | None = None) -> Iterator[None]:
        """Run the ``with`` block on complete weights: wait while an update is open (at most ``wait_s`` and at
        most until the update's deadline), refuse while the weights are incomplete."""
        t0 = time.monotonic()
        with self._cv:
            while self._open is not None:
                u, now = self._open, time.monotonic()
                mine = None if wait_s is None else t0 + wait_s
                until = u.deadline if mine is None else min(u.deadline, mine)
                if now >= until:
                    if now >= u.deadline:
                        raise WeightUpdateStalledError(
                            f"{self.name}: {what} waited {now - t0:.0f} s for the update of {u.what}, open for "
                            f"{now - u.started:.0f} s, past its {u.timeout_s:g} s bound (learner.sync_timeout_s); "
                            "the engine's weights are not known to be complete")
                    raise WeightUpdateStalledError(
                        f"{self.name}: {what} waited {now - t0:.0f} s (its bound, from train.watchdog.engine_s) for "
                        f"the update of {u.what}, open for {now - u.started:.0f} s")
                self._cv.wait(until - now)
            if self._incomplete is not None:
                raise WeightUpdateStalledError(f"{self.name}: {what} refused: {self._incomplete}")
            if self._asleep is not None:
                why, since = self._asleep
                raise EngineAsleepError(f"{self.name}: {what} refused: {why} (for {time.monotonic() - since:.0f} s)")
            self._generating += 1
        try:
            yield
        finally:
            with self._cv:
                self._generating -= 1
                self._cv.notify_all()

    # -- updates -----------------------------------------------------------------------------------
    def begin(self, what: str, timeout_s: float | None = None, transaction: str | None = None,
              touches_weights: bool = True) -> str:
        """Pause generation and open an update; returns its transaction id (``transaction`` if given).

        Waits for the generation in flight (new calls already wait), within the update's ``timeout_s``. An open
        update past its deadline is superseded (its weights were incomplete anyway); one within it is not: a
        second transaction cannot start until the first finishes."""
        timeout = DEFAULT_UPDATE_TIMEOUT_S if timeout_s is None else float(timeout_s)
        with self._cv:
            now = time.monotonic()
            if self._open is not None and now < self._open.deadline:
                u = self._open
                raise RuntimeError(
                    f"{self.name}: cannot start the update of {what}: the update of {u.what} (transaction "
                    f"{u.transaction}) is open for {now - u.started:.0f} s of its {u.timeout_s:g} s; one update at "
                    "a time")
            tx = transaction or f"{self.name}-update-{next(self._ids)}"
            # Claim the gate first: generation calls arriving from now on wait behind this update.
            self._open = Update(tx, what, now, now + timeout, timeout, touches_weights)
            while self._generating:
                left = self._open.deadline - time.monotonic()
                if left <= 0:
                    self._open = None
                    self._cv.notify_all()
                    raise WeightUpdateStalledError(
                        f"{self.name}: the generation in flight did not finish within the {timeout:g} s bound of "
                        f"the update of {what}; the update did not start")
                self._cv.wait(left)
            self._open.started = time.monotonic()
            if touches_weights:
                self._incomplete = (f"the update of {what} (transaction {tx}) began and has not finished; the "
                                    "engine serves no complete weights until an update finishes")
            return tx

    def check(self, transaction: str, step: str) -> Update:
        """The open update if it is ``transaction``; else raise (an interleaved, finished or superseded one)."""
        with self._cv:
            u = self._open
            if u is None or u.transaction != transaction:
                now_open = f"the update of {u.what} (transaction {u.transaction}) is open" if u else "none is open"
                raise RuntimeError(f"{self.name}: {step} of transaction {transaction} refused: {now_open}; start a "
                                   "new update (start_weight_update) and send its chunks with its transaction id")
            return u

    def end(self, transaction: str, failure: str | None = None) -> None:
        """Close the update and resume generation. ``failure``: why it did not complete; if it had touched the
        weights, they stay marked incomplete (generation is refused with this reason)."""
        with self._cv:
            u = self._open
            if u is None or u.transaction != transaction:
                return  # superseded after its deadline: the newer update owns the gate
            self._open = None
            if u.touches_weights:
                self._incomplete = None if failure is None else (
                    f"the update of {u.what} failed ({failure}); an update must finish first")
            self._cv.notify_all()

    @contextmanager
    def update(self, what: str, timeout_s: float | None = None, touches_weights: bool = True) -> Iterator[str]:
        """``begin`` .. ``end`` around one call that does a whole update (the object-store load)."""
        tx = self.begin(what, timeout_s, touches_weights=touches_weights)
        try:
            yield tx
        except BaseException as e:
            self.end(tx, f"{type(e).__name__}: {e}")
            raise
        self.end(tx)

    # -- sleep (train.sleep_engines) ------------------------------------------------------------------
    def fall_asleep(self, why: str) -> None:
        """From now on generation is refused with ``why`` (call it inside ``update``: nothing is generating)."""
        with self._cv:
            self._asleep = (why, time.monotonic())

    def wake(self) -> None:
        with self._cv:
            self._asleep = None
            self._cv.notify_all()

    # -- introspection -----------------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        """For ``info`` and tests: whether an update is open, generation in flight, incomplete weights."""
        with self._cv:
            u = self._open
            return {"open": None if u is None else {"transaction": u.transaction, "what": u.what,
                                                    "seconds": time.monotonic() - u.started},
                    "generating": self._generating, "incomplete": self._incomplete,
                    "asleep": None if self._asleep is None else self._asleep[0]}
