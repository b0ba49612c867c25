"""The mirrored strategies' replica group: one Replica actor per worker, placed and called
concurrently from the driver."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from labdist import actor_call as remote
from labdist import shipping
from labdist.cluster.actor_group import ActorGroup
from labdist.cluster.lane_channel import LaneStepChannel, connect_lanes
from labdist.cluster.sent_functions import SentFunctions
from labdist.cluster.step_channel import LATE_MARGIN_S, ActorStepChannel, StepChannel
from labdist.collectives import registry
from labdist.collectives.plugin import PLUGIN_NAME, CollectivePlugin
from labdist.devices import pinning_backend
from labdist.errors import LabdistError, ReplicaLostError, ReplicaUnresponsiveError
from labdist.replica.actor import Replica
from labdist.replica.step_event import ResumeStep, RunStep, StepEvent


class DaskReplicaGroup(ActorGroup):
    """One Replica actor per worker: a `ReplicaGroup` (strategies/replica_group.py)."""

    runs_steps = True
    remote_input = True  # input pipelines may move to the replicas (data/feeds.py)

    def __init__(self, num_replicas: int | None, cluster: Any, device: str,
                 collective_timeout: float, connect_timeout: float, security: Any = None,
                 transport: str = "auto", knob: tuple[str, str] | None = None,
                 workers: list[str] | None = None):
        super().__init__()
        self._settings = (device, collective_timeout, connect_timeout, security, transport, knob)
        self.group = uuid.uuid4().hex
        self.workers: list[str] = []
        self._keys: list[str] = []  # the replicas' actor keys, once every one has started
        self.infos: list[dict] = []
        self.transport: str = registry.FALLBACK  # the host transport collectives use
        self.device_transport: str | None = None  # e.g. "nccl", for device replicas' data
        self.steps: StepChannel | None = None
        self._functions = SentFunctions()  # which step functions each replica holds
        try:
            self._connect(cluster, num_replicas or (len(pinning_backend(device).visible_gpus())
                                                    or 2), connect_timeout, security, device)
            self.workers = (list(workers) if workers is not None  # a membership epoch's
                            else self._pick_workers(num_replicas, connect_timeout))
            self.client.register_plugin(CollectivePlugin(), name=PLUGIN_NAME)
            futures = [self._start_actor(Replica, addr, f"labdist-replica-{self.group}-{rank}",
                                         self.group, rank, self.workers, device,
                                         collective_timeout)
                       for rank, addr in enumerate(self.workers)]
            if workers is None:
                self.client.gather(futures)
            else:  # an epoch's replicas: a worker lost (or frozen) while they start is named
                self._await_actors(futures, collective_timeout + LATE_MARGIN_S)
            self._keys = [f.key for f in futures]
            self.infos = self._sync(self._all, "info", [()] * len(self.workers))
            self.transport, self.device_transport = self._choose_transports(
                transport, knob or ("transport", transport))
            self.steps = self._step_channel(transport, connect_timeout)
        except BaseException:
            self.close()  # stop whatever replicas started, release what we own
            raise

    def _await_actors(self, futures: list, timeout: float) -> None:
        """Wait for the actors to start; a worker that leaves meanwhile is a ReplicaLostError
        naming it (its actor would wait for it forever), one silent for `timeout` seconds a
        ReplicaUnresponsiveError."""
        deadline = time.monotonic() + timeout
        while True:
            if all(f.done() for f in futures):
                self.client.gather(futures)  # raises an actor's own error, if any
                return
            time.sleep(0.02)
            present = set(self.present_workers())
            gone = [w for w in self.workers if w not in present]
            if gone:
                raise ReplicaLostError(f"worker(s) {', '.join(gone)} left the cluster before "
                                       "their replica started")
            if time.monotonic() > deadline:
                late = [w for w, f in zip(self.workers, futures, strict=True) if not f.done()]
                raise ReplicaUnresponsiveError(
                    f"the replicas on {', '.join(late)} did not start within {timeout:g} s")

    def _choose_transports(self, knob: str, spelled: tuple[str, str]) -> tuple[str, str | None]:
        """For each layer, the first of the registry's candidates (collectives/registry.py)
        that every replica can open and reach every other with: (host, device or None).
        `spelled` is (parameter, value) as the user passed the knob, for errors."""
        n = len(self.workers)
        if n == 1:
            return registry.FALLBACK, None
        chosen: dict[str, str | None] = {}
        for layer in registry.LAYERS:
            chosen[layer] = None
            for name in registry.candidates(knob, layer):
                failed = self._unreachable(name)
                if not failed:
                    chosen[layer] = name
                    break
                if registry.required(knob, layer):
                    parameter, value = spelled
                    raise ValueError(
                        f"{parameter}={value!r} needs {registry.TRANSPORTS[name].requirement}; "
                        f"these are not: {', '.join(self.workers[r] for r in failed)}. Use "
                        f"{parameter}='auto', which uses {name} only where every replica can")
        self._sync(self._all, "transport_use", [([c for c in chosen.values() if c],)] * n)
        return chosen[registry.HOST], chosen[registry.DEVICE]

    def _unreachable(self, name: str) -> list[int]:
        """The ranks that cannot use transport `name` (cannot open it, or reach every peer)."""
        n = len(self.workers)
        probes = self._sync(self._all, "transport_probe", [(name,)] * n)
        failed = [r for r, p in enumerate(probes) if p is None]
        if failed:
            return failed
        root: tuple = ()  # NCCL: rank 0 alone makes the unique id, every rank joins with it
        if registry.TRANSPORTS[name].bootstraps:
            root = (self._sync(self._all, "transport_bootstrap", [(name, probes)], [0])[0],)
        reached = self._sync(self._all, "transport_connect", [(name, probes, *root)] * n)
        return [r for r, ok in enumerate(reached) if not ok]

    def _step_channel(self, transport: str, timeout: float) -> StepChannel:
        """Steps over the fast lane (cluster/lane_channel.py), unless told to use Dask comms only or
        the cluster uses TLS; any failure to connect falls back to actor calls."""
        collective_timeout = self._settings[1]
        if transport != "tcp":
            n = len(self.workers)
            try:
                lanes = connect_lanes(self._sync(self._all, "lane_open", [()] * n), timeout)
            except Exception:  # e.g. an address family this host cannot bind: not fatal
                lanes = None
            if lanes is not None:
                return LaneStepChannel(self, lanes, collective_timeout)
            with contextlib.suppress(Exception):  # the replicas' unused ends
                self._sync(self._all, "lane_close", [()] * n)
        return ActorStepChannel(self, collective_timeout)

    def lost_replicas(self) -> list[int]:
        """The ranks whose worker is gone: the client was told so, or the scheduler no longer
        lists the worker (the client hears of a removal a moment after the scheduler acts,
        and `recover()` right after a loss must not find nothing lost)."""
        present = set(self.present_workers())
        return [r for r, w in enumerate(self.workers) if self.lost(r) or w not in present]

    def reform(self, num_replicas: int | None = None) -> DaskReplicaGroup:
        """A new group on the workers present now (at most `num_replicas`), which takes over
        what this one owns (client, embedded cluster); this one is closed."""
        if num_replicas is not None:
            num_replicas = min(num_replicas, len(self.present_workers())) or None
        new = DaskReplicaGroup(num_replicas, self.client, *self._settings)
        new.take_over(self)
        self.close()
        return new

    @property
    def settings(self) -> tuple:
        """What a successor on other workers is made with (after num_replicas, cluster)."""
        return self._settings

    def close_quickly(self, alive: list[int]) -> None:
        """`close` after a membership change: only the replicas `alive` are asked to let go
        (the others' workers are gone; asking them would wait for nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(Exception):
                self._sync(self._close_ranks, alive)
            if self.steps is not None:
                self.steps.close()
                self.steps = None
        finally:
            self._release()

    async def _close_ranks(self, ranks: list[int]) -> None:
        """Ask `ranks` to let go; one that does not answer within the step channel's patience
        (a frozen worker) is left to Dask, which drops its actor with it."""
        patience = self.steps.patience if self.steps is not None else None
        tasks = [asyncio.ensure_future(self.call(r, "close")) for r in ranks]
        if tasks:
            await asyncio.wait(tasks, timeout=patience)
        _settle_tasks(tasks)

    @property
    def num_replicas(self) -> int:
        return len(self.workers)

    def where(self, rank: int) -> str:
        return f"replica {rank} (worker {self.workers[rank]})"

    def _pick_workers(self, num_replicas: int | None, timeout: float) -> list[str]:
        want = num_replicas or 1
        try:
            self.client.wait_for_workers(want, timeout=timeout)
        except (TimeoutError, OSError):
            have = len(self.client.scheduler_info(n_workers=-1)["workers"])
            raise ValueError(
                f"num_replicas={num_replicas} but the cluster has {have} worker(s) after "
                f"waiting {timeout:g} s; start more workers or ask for fewer replicas"
            ) from None
        workers = self.present_workers()
        return workers[:num_replicas] if num_replicas else workers

    # -- calls ------------------------------------------------------------------------------------
    def _sync(self, fn, *args):
        if self.scheduler_lost():
            raise self.scheduler_error()
        return self.client.sync(fn, *args)

    def lost(self, rank: int) -> bool:
        """The scheduler told the client this replica's worker (and so its actor) is gone."""
        return self.gone(self._futures[rank])

    def lost_error(self, rank: int, detail: str) -> LabdistError:
        if self.scheduler_lost():  # the scheduler, not the worker, is what left
            return self.scheduler_error()
        return ReplicaLostError(
            f"{self.where(rank)} was lost ({detail}), and its variable copies with it. Close "
            "this strategy and start a new one (restore from a checkpoint)")

    async def call(self, rank: int, method: str, *args) -> Any:
        if self.lost(rank):
            raise self.lost_error(rank, "its worker left the cluster")
        try:
            return await remote.call(self.client.rpc, self.workers[rank], self._keys[rank],
                                     method, *args, where=self.where(rank))
        except remote.Unreachable as e:
            raise self.lost_error(rank, str(e)) from None

    async def _all(self, method: str, args_per_rank: list[tuple], ranks=None) -> list[Any]:
        ranks = range(len(self.workers)) if ranks is None else ranks
        return await asyncio.gather(
            *(self.call(r, method, *a) for r, a in zip(ranks, args_per_rank, strict=True)))

    def call_each(self, method: str, args_per_rank: list[tuple], ranks=None) -> list[Any]:
        """Call `method` of each replica in `ranks` (default all) with its arguments (quorum
        training's calls, and the protocol's): `_all`, once no replica owes a step's answer
        (the step channel's `settle`: an abandoned step no longer runs there); once one replica
        has answered, the others have the channel's patience (collective_timeout plus a
        margin), then ReplicaUnresponsiveError names them (a frozen worker never answers)."""
        ranks = list(range(len(self.workers)) if ranks is None else ranks)
        self.steps.settle(ranks, release=False)  # a merge_call function may be the caller
        patience = self.steps.patience

        async def gather() -> list[Any]:
            tasks = {asyncio.ensure_future(self.call(r, method, *a)): r
                     for r, a in zip(ranks, args_per_rank, strict=True)}
            _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if pending:
                _, pending = await asyncio.wait(pending, timeout=patience)
            _settle_tasks(tasks)
            if pending:
                raise ReplicaUnresponsiveError(
                    "; ".join(self.where(tasks[t]) for t in pending) + f" did not answer "
                    f"{method!r} within {patience:g} s of its peers (collective_timeout plus a "
                    "margin): its worker may be frozen or stuck in native code. Close this "
                    "strategy and create a new one if it does not come back")
            return [task.result() for task in tasks]

        return self._sync(gather)

    # -- the replica-group protocol --------------------------------------------------------------
    def create(self, var_id, host):
        self.call_each("create", [(var_id, host)] * len(self.workers))

    def read(self, var_id, ranks):
        return self.call_each("read", [(var_id,)] * len(ranks), ranks)

    def write(self, var_id, mode, host, want):
        n = len(self.workers)
        got = self.call_each("write", [(var_id, mode, host, r in want) for r in range(n)])
        return [got[r] for r in want]

    def start_step(self, run_id, fn, args_r, kwargs_r, steps=1, forget=()):
        if self.scheduler_lost():
            raise self.scheduler_error()
        n = len(self.workers)
        refs = self._functions.refs(fn, n, forget)
        made: dict[tuple, RunStep] = {}  # the same request object where ranks get the same
        requests = []
        for r in range(n):
            same = (id(refs[r]), id(args_r[r]), id(kwargs_r[r]))
            if same not in made:
                made[same] = RunStep(run_id, refs[r], args_r[r], kwargs_r[r], steps)
            requests.append(made[same])
        events = self._functions.answered(self.steps.step(run_id, requests,
                                                              list(range(n))))
        return self._checked(events)

    def resume(self, run_id, values, errors, ranks=None) -> list[StepEvent]:
        ranks = list(range(len(self.workers))) if ranks is None else ranks
        requests = [ResumeStep(values[r], errors[r] if errors else None) for r in ranks]
        events = self.steps.step(run_id, requests, ranks)
        self._functions.answered(events, ranks)
        return self._checked(events)

    def scatter(self, arrays: list[Any]) -> list[Any] | None:
        """Each array copied once to every replica's worker, as `placed.ScatteredArray`s;
        None if that fails (a worker gone, no room). One scatter per worker, so each copy is
        a key of its own: the scheduler's memory manager drops extra replicas of one key
        (nothing waits on them), which a broadcast scatter would make."""
        from labdist.shm.placed import ScatteredArray

        try:
            per_worker = [self.client.scatter(list(arrays), workers=[w], hash=False)
                          for w in self.workers]
        except Exception:
            return None
        return [ScatteredArray([futures[i] for futures in per_worker], a)
                for i, a in enumerate(arrays)]

    def _checked(self, events: list[StepEvent]) -> list[StepEvent]:
        """Failures because the scheduler went away (workers closing under a step: "Event loop
        is closed", lanes dropping) are that, not the replicas' own errors."""
        if any(e.kind == "error" for e in events) and self.scheduler_lost():
            first = next(e.error for e in events if e.kind == "error")
            raise self.scheduler_error() from first
        return events

    def update(self, fn, args_r, kwargs_r):
        fn_bytes = shipping.dumps(fn)
        return self.call_each("update",
                             [(fn_bytes, a, k) for a, k in zip(args_r, kwargs_r, strict=True)])

    async def _close_all(self) -> None:
        """Ask every replica to let go; one that does not answer within the patience of the
        step channel (a frozen worker) is left to Dask, which drops its actor with it."""
        await self._close_ranks(list(range(len(self.workers))))

    def _close_actors(self) -> None:
        if self._keys:
            with contextlib.suppress(Exception):
                self._sync(self._close_all)
        if self.steps is not None:
            self.steps.close()
            self.steps = None


def _settle_tasks(tasks) -> None:
    """Cancel the tasks still running; take the exceptions of those that failed (asyncio
    would log each one never retrieved)."""
    for task in tasks:
        if not task.done():
            task.cancel()
        elif not task.cancelled():
            task.exception()
