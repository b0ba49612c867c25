"""The strategy's methods for quorum training (`fault_tolerance="quorum"`), mixed into
`Strategy`: a step as a transaction over the replicas alive, a worker taken in, and the
membership changes as they happen. Without quorum mode they do what a plain strategy would
(run_transaction is `run`; nothing ever changes the replicas)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labdist.quorum import fit as quorum
from labdist.quorum.fit import MembershipChange


class QuorumMethods:
    """Mixed into `Strategy`, whose `_quorum` (a `quorum.Quorum` or None), `_lock`, `run`
    and `experimental_local_results` it uses."""

    @property
    def fault_tolerance(self) -> str:
        """"quorum" (training goes on among the replicas alive) or "none"."""
        return "none" if self._quorum is None else "quorum"

    def run_transaction(self, fn: Callable, args_for: Callable[[int], tuple],
                        step: int = 0) -> list[Any]:
        """Run `fn(*args_for(n))` once on each of the n replicas and return each replica's
        result, in replica order (a list, as `experimental_local_results` gives). For a step
        whose arguments depend on how many replicas share it (the lab's: a global batch
        split in n). In quorum mode the run is a transaction: joined workers are taken in
        first, and a replica lost meanwhile leaves the survivors to finish or redo it
        (`args_for` is called again with fewer), so the list is shorter; `step` is the step
        number membership changes report. Otherwise it is `run`."""
        self._check_open()
        if self._quorum is not None:
            return quorum.run_step(self, self._quorum, fn, args_for, step)
        with self._lock:
            out = self.run(fn, args=args_for(self.num_replicas_in_sync))
        return list(zip(*(self.experimental_local_results(o) for o in out), strict=True)) \
            if isinstance(out, tuple) else list(self.experimental_local_results(out))

    def add_local_replica(self) -> None:
        """Quorum mode on an embedded cluster: start one more worker, which becomes a replica
        at the next step boundary (with its copies from a live peer)."""
        self._check_open()
        if self._quorum is None:
            raise RuntimeError(f"{self!r} is not in quorum mode: only quorum training takes "
                               "in new replicas; use fault_tolerance='quorum'")
        quorum.add_local_worker(self, self._quorum)

    @property
    def membership_changes(self) -> list[MembershipChange]:
        """Quorum training's membership changes so far, oldest first (empty otherwise)."""
        return [] if self._quorum is None else list(self._quorum.changes)

    def add_membership_listener(self, fn: Callable[[MembershipChange], Any]
                                ) -> Callable[[], None]:
        """Call `fn(change)` (a `MembershipChange`) each time quorum training changes the
        replicas; returns the function that stops it. Without quorum mode nothing changes
        them, and `fn` is never called."""
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not allowed; use a callable")
        if self._quorum is None:
            return lambda: None
        return self._quorum.add_listener(fn)
