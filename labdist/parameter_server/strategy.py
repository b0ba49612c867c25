"""`ParameterServerStrategy`: variables on parameter-server tasks, workers that pull, compute and
push.

mode="async": each worker's update is applied when it arrives (Downpour / TF2's
ParameterServerStrategy); mode="sync": SyncReplicas — a barrier, `replicas_to_aggregate` fresh
gradients aggregated into one update per global step, late backup gradients dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from labdist import checks
from labdist.cluster import capacity
from labdist.collectives import compression as compressors
from labdist.parameter_server.actors import ParameterServerGroup
from labdist.parameter_server.coordinator import ClusterCoordinator, Coordinated
from labdist.parameter_server.fit import train_model_steps
from labdist.parameter_server.settings import PsSettings
from labdist.parameter_server.stats import ParameterServerStats
from labdist.parameter_server.worker_context import WorkerStrategy
from labdist.replica import replica_context
from labdist.strategies.base import Strategy
from labdist.variables import Variable

MODES = ("async", "sync")
TRANSPORTS = ("auto", "tcp")  # how workers reach parameter servers (parameter_server/shm_client.py)


def _count(name: str, value: Any, minimum: int, optional: bool = True) -> int | None:
    return checks.integer(name, value, minimum, optional=optional)


class ParameterServerStrategy(Strategy, Coordinated):
    """Variables created in `scope()` live on `num_ps` ParameterStore actors (round-robin);
    functions run on the other workers through `ld.ClusterCoordinator(strategy)`, and
    `model.fit` works as well.

    cluster: None (start and own a LocalCluster of num_workers + num_ps processes), a
        scheduler address, a `distributed.Client` or a Dask cluster object (never closed).
    num_workers: workers that compute (default: 2 embedded, else every worker not a PS).
    num_ps: parameter-server tasks (each on its own worker when the cluster has enough).
    mode: "async" or "sync".
    use_locking: serialise the updates of each variable (reads never lock, and never see an
        update half applied); without it updates interleave, torn reads happen and updates
        can be lost (both counted: `stats()`). Neither way protects a read-modify-write across
        a pull and a push (read, then assign): the updates it overwrites are counted lost.
    replicas_to_aggregate, total_num_replicas: sync mode; gradients per update (default: all)
        and workers taking part in each step (default: num_workers); more workers than
        gradients aggregated makes backups whose late gradients are dropped.
    staleness_bound: async mode; a worker waits while it is more than this many scheduled
        functions ahead of the slowest (stale synchronous parallel, beyond TF).
    chunk_size: elements per chunk in which updates are applied (and torn reads detected).
    ps_timeout: seconds a parameter server may answer nothing before it is declared lost
        (ParameterServerLostError), on every call the driver or a worker makes to it. A call
        still waiting (a sync barrier held up by a straggler) is never cut short while the PS
        answers a cheap liveness check; a frozen PS answers neither. math.inf: wait forever.
    transport: "auto" (a worker on its parameter server's host pulls and pushes through
        shared memory, with a Unix socket for the call; other workers, and every other call,
        over Dask comms) or "tcp" (Dask comms only). What a call means is the same either way.
    compression: the compressor of every worker's pushes ('none', 'fp16', 'bf16',
        `ld.compression.TopK(ratio)`, `PowerSGD(rank)`), error feedback per worker; settable
        later as `strategy.compression` (each worker encodes its own pushes and keeps its own
        error-feedback residuals: parameter_server/compressed_push.py).
    """

    def __init__(self, cluster: Any = None, *, num_workers: int | None = None, num_ps: int = 1,
                 mode: str = "async", use_locking: bool = False,
                 replicas_to_aggregate: int | None = None,
                 total_num_replicas: int | None = None, staleness_bound: int | None = None,
                 chunk_size: int = 65536, connect_timeout: float = 10.0,
                 ps_timeout: float = 60.0, transport: str = "auto", security: Any = None,
                 compression: Any = None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not supported; allowed: {', '.join(MODES)}")
        _count("num_workers", num_workers, 1)
        _count("num_ps", num_ps, 1, optional=False)
        _count("chunk_size", chunk_size, 1, optional=False)
        if not isinstance(use_locking, bool):
            raise ValueError(f"use_locking={use_locking!r} must be True or False")
        _count("replicas_to_aggregate", replicas_to_aggregate, 1)
        _count("total_num_replicas", total_num_replicas, 1)
        _count("staleness_bound", staleness_bound, 0)
        if mode == "async" and (replicas_to_aggregate, total_num_replicas) != (None, None):
            raise ValueError("replicas_to_aggregate and total_num_replicas are for mode='sync' "
                             f"(SyncReplicas); got them with mode={mode!r}")
        if mode == "sync" and staleness_bound is not None:
            raise ValueError(f"staleness_bound={staleness_bound!r} is for mode='async': sync "
                             "mode has no staleness (every gradient is fresh or dropped)")
        if (replicas_to_aggregate is not None and total_num_replicas is not None
                and replicas_to_aggregate > total_num_replicas):
            raise ValueError(f"replicas_to_aggregate={replicas_to_aggregate} cannot exceed "
                             f"total_num_replicas={total_num_replicas}")
        checks.positive("connect_timeout", connect_timeout, unit="seconds")
        if not isinstance(ps_timeout, int | float) or isinstance(ps_timeout, bool) \
                or not ps_timeout > 0:
            raise ValueError(f"ps_timeout={ps_timeout!r} must be a positive number of seconds "
                             "(math.inf: wait forever)")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport={transport!r} is not supported; allowed: "
                             f"{', '.join(TRANSPORTS)}")
        compressor = compressors.parse(compression)  # checked before anything starts
        if num_workers is None and cluster is None:
            num_workers = total_num_replicas or 2
        if cluster is None:
            capacity.check_local_workers(num_workers + num_ps, f"num_workers={num_workers} + "
                                         f"num_ps={num_ps}")
        group = ParameterServerGroup(cluster, num_workers, num_ps, float(connect_timeout),
                                     security)
        try:
            total, aggregate = self._sync_sizes(group.num_workers, mode,
                                                total_num_replicas, replicas_to_aggregate)
            group.start_actors(PsSettings(
                mode=mode, use_locking=use_locking, chunk_size=chunk_size,
                replicas_to_aggregate=aggregate, staleness_bound=staleness_bound,
                ps_timeout=float(ps_timeout), transport=transport, compression=compressor))
        except BaseException:
            group.close()
            raise
        self.mode = mode
        self.use_locking = use_locking
        self.replicas_to_aggregate = aggregate
        self.total_num_replicas = total
        self.staleness_bound = staleness_bound
        self.ps_timeout = float(ps_timeout)
        self._push_compressor = compressor
        self._coordinator: ClusterCoordinator | None = None
        self._bound: set[tuple] = set()  # (optimizer, weights, slots) bound on the PSs
        super().__init__(group)

    @staticmethod
    def _sync_sizes(workers: int, mode: str, total: int | None, aggregate: int | None):
        if mode != "sync":
            return None, None
        total = total or workers
        if total > workers:
            raise ValueError(f"total_num_replicas={total} but only {workers} worker(s) compute; "
                             "each worker takes part in a step once")
        aggregate = aggregate or total
        if aggregate > total:
            raise ValueError(f"replicas_to_aggregate={aggregate} cannot exceed "
                             f"total_num_replicas={total}")
        return total, aggregate

    # -- what a user looks at ---------------------------------------------------------------
    @property
    def workers(self) -> list[str]:
        """The address of each worker that computes, in worker-index order."""
        return list(self.ps_group.worker_addresses)

    @property
    def parameter_servers(self) -> list[str]:
        """The worker address of each parameter server."""
        return list(self.ps_group.ps_addresses)

    @property
    def num_workers(self) -> int:
        return self.ps_group.num_workers

    @property
    def num_ps(self) -> int:
        return self.ps_group.num_ps

    @property
    def client(self):
        return self.ps_group.client

    @property
    def dashboard_link(self) -> str | None:
        return self.ps_group.dashboard_link

    def parameter_server_of(self, variable: Variable) -> int:
        """Which parameter server holds `variable`."""
        if not isinstance(variable, Variable) or variable.strategy_id != self.id:
            raise ValueError(f"variable={variable!r} is not a variable of {self!r}")
        return self.ps_group.placement[variable.id]

    @property
    def ps_group(self) -> ParameterServerGroup:
        """The strategy's group (`strategy.group`), with the parameter servers' own calls."""
        return self.group

    # -- compressed pushes ----------------------------------------------------------------
    @property
    def compression(self) -> compressors.Compressor | None:
        """The compressor of every worker's pushes (None: plain). Settable: 'none', 'fp16',
        'bf16', or `ld.compression.TopK(ratio)` / `PowerSGD(rank)`; each worker's residuals
        carry over a change (they go out with its next push). A lost worker is left out:
        training goes on without it."""
        return self._push_compressor

    @compression.setter
    def compression(self, value: Any) -> None:
        compressor = compressors.parse(value)
        self._check_open()
        self.ps_group.call_live_workers("set_compression", compressor)
        self._push_compressor = compressor

    def push_stats(self) -> list[dict[str, Any]]:
        """Per worker: `raw_bytes` (its pushed updates' array bytes uncompressed),
        `sent_bytes` (what they took on the wire, compressed) and `residual_norm` (None for
        a lost worker: its counters went with it)."""
        self._check_open()
        return self.ps_group.call_live_workers("push_stats")

    def __repr__(self) -> str:
        extra = (f", replicas_to_aggregate={self.replicas_to_aggregate}, total_num_replicas="
                 f"{self.total_num_replicas}" if self.mode == "sync" else "")
        return (f"ParameterServerStrategy(num_workers={self.num_workers}, num_ps={self.num_ps}, "
                f"mode={self.mode!r}, use_locking={self.use_locking}{extra})")

    def __reduce__(self):  # captured in a scheduled function: its worker-side stand-in
        return (WorkerStrategy, ())

    # -- running ------------------------------------------------------------------------------
    def cluster_coordinator(self) -> ClusterCoordinator:
        """This strategy's one ClusterCoordinator (what `ld.ClusterCoordinator(strategy)`
        returns): made on first use, and again once the last one was closed."""
        self._check_open()
        if self._coordinator is None or self._coordinator.closed:
            self._coordinator = ClusterCoordinator.start(self, self.ps_group)
            self._lifetime.also_close(self._coordinator.close)
        return self._coordinator

    def check_arguments(self, args: tuple, kwargs: dict | None) -> tuple[tuple, dict]:
        """`args` and `kwargs` as the one replica a function runs on sees them (a PerReplica
        value's component); a ValueError names a variable of another strategy."""
        return self._select(tuple(args), 0, "args"), self._select(kwargs or {}, 0, "kwargs")

    def run(self, fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run `fn(*args, **kwargs)` once, on whichever worker is free, and return its result
        (one replica: num_replicas_in_sync is 1). Use a ClusterCoordinator to run many
        functions at once."""
        self._check_open()
        if replica_context.current() is not None:
            raise RuntimeError("strategy.run cannot be called inside a step function")
        if not isinstance(args, tuple | list):
            raise TypeError(f"args={args!r} must be a tuple of positional arguments")
        args, kwargs = self.check_arguments(args, kwargs)
        return self.cluster_coordinator().schedule(fn, args, kwargs).fetch()

    def train_model_steps(self, step, groups, first_iteration: int):
        """`model.fit` on parameter servers (see `Strategy.train_model_steps`). Async: each
        group is one scheduled function that pulls, computes and pushes step after step;
        sync: each global batch is split over `total_num_replicas` functions whose gradients
        meet at the barrier (parameter_server/fit.py)."""
        return train_model_steps(self, step, groups, first_iteration)

    # -- lab controls and figures -----------------------------------------------------------
    def stats(self) -> ParameterServerStats:
        """Staleness histogram, torn reads, lost updates, interleaved updates, updates per
        worker, dropped stale gradients, global step and throughput (stats.py)."""
        self._check_open()
        shards = self.ps_group.store_call_all("stats")
        step = (shards[0]["global_step"] if self.mode == "sync"
                else max(s["global_step"] for s in shards))
        return ParameterServerStats.merge(self.mode, self.use_locking, step, shards,
                                          shards[0]["ssp"])

    def reset_stats(self) -> None:
        self._check_open()
        self.ps_group.store_call_all("reset_stats")

    def set_worker_delay(self, worker: int | str, seconds: float) -> None:
        """Make `worker` (an index or address) a straggler: each of its pushes waits `seconds`
        first (0 to undo)."""
        self._check_open()
        addresses = self.ps_group.worker_addresses
        if isinstance(worker, str) and worker in addresses:
            worker = addresses.index(worker)
        if isinstance(worker, bool) or not isinstance(worker, int) \
                or not 0 <= worker < len(addresses):
            raise ValueError(f"worker={worker!r} is not a worker of this strategy; allowed: an "
                             f"index 0..{len(addresses) - 1} or one of {addresses}")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"seconds={seconds!r} must be a finite number >= 0")
        self.ps_group.call_workers([worker], "set_delay", float(seconds))

    def set_chunk_delay(self, seconds: float) -> None:
        """Hold each chunk of every update this long before writing it (0 to undo): the
        window in which updates interleave widens, so without use_locking torn reads and lost
        updates become certain instead of rare (tests, demos, the lab's apply delay)."""
        self._check_open()
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"seconds={seconds!r} must be a finite number >= 0")
        self.ps_group.store_call_all("set_chunk_delay", float(seconds))

    def global_step(self) -> int:
        """Steps applied so far: sync mode's global step (every PS keeps the same), async
        mode's largest count of updates on one PS."""
        self._check_open()
        if self.mode == "sync":
            return self.ps_group.store_call(0, "global_step")
        return max(self.ps_group.store_call_all("global_step"))

    def bind_optimizer(self, optimizer: Any, weights: list[Variable],
                       slots: list[dict[str, Variable]]) -> None:
        """Apply pushed gradients of each weight with `optimizer` on the weight's parameter
        server, whose state is the weight's `slots` (moved next to it first). `model.fit` calls
        it before training; it binds again only when something changed (a recompiled model, or
        a hyperparameter such as the learning rate: a LearningRateScheduler between epochs)."""
        self._check_open()
        signature = (id(optimizer), tuple(sorted(optimizer.hyperparameters().items())),
                     tuple(v.id for v in weights), tuple(s.id for d in slots for s in d.values()))
        if signature in self._bound:
            return
        group = self.ps_group
        for weight, state in zip(weights, slots, strict=True):
            home = group.placement[weight.id]
            for slot in state.values():
                group.move(slot.id, home)
            group.store_call(home, "bind", weight.id, optimizer,
                             {name: s.id for name, s in state.items()})
        self._bound.add(signature)

