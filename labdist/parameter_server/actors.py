"""Where a ParameterServerStrategy's actors live and how the driver calls them: k
`ParameterStore` actors (each on its own worker when the cluster has enough workers) and one
`ParameterServerWorker` per remaining worker. Variables are placed round-robin over the stores.

It also speaks the replica-group protocol of strategies/base.py (with one "replica": the
parameter servers hold the only copy), so `ld.Variable` reads and writes from the driver work
unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from typing import Any

from labdist import actor_call as remote
from labdist.cluster.actor_group import ActorGroup
from labdist.errors import ParameterServerLostError
from labdist.parameter_server.liveness import Unresponsive, watched_call
from labdist.parameter_server.settings import PsSettings
from labdist.parameter_server.store import ParameterStore
from labdist.parameter_server.worker import ParameterServerWorker

CLOSE_S = 5.0  # closing waits at most this long (or ps_timeout) for each parameter server


class ParameterServerGroup(ActorGroup):
    """The parameter servers and their workers: a `ReplicaGroup`
    (strategies/replica_group.py) whose one copy of each variable lives on one parameter
    server, and whose workers run scheduled functions instead of steps."""

    num_replicas = 1  # one copy of every variable, on its parameter server
    runs_steps = False  # workers run what the coordinator schedules (coordinator.py)
    remote_input = False  # per-worker datasets are made on the workers by the coordinator
    ps_timeout = 60.0  # seconds a parameter server may answer nothing (set by start)

    def __init__(self, cluster: Any, num_workers: int | None, num_ps: int,
                 connect_timeout: float, security: Any = None):
        super().__init__()
        self.id = uuid.uuid4().hex
        self.ps_addresses: list[str] = []
        self.worker_addresses: list[str] = []
        self._store_keys: list[str] = []
        self._store_futures: list = []
        self._worker_keys: list[str] = []
        self._worker_futures: list = []
        self._lock = threading.Lock()
        self.placement: dict[int, int] = {}
        self.placement_version = 0
        self._sent: dict[int, int] = {}
        self._next_shard = 0
        self.bounded = False
        self._silent: dict[int, str] = {}  # PS index -> how it stopped answering
        try:
            self._connect(cluster, (num_workers or 2) + num_ps, connect_timeout, security)
            self.ps_addresses, self.worker_addresses = self._place(
                num_workers, num_ps, connect_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        return len(self.worker_addresses)

    @property
    def num_ps(self) -> int:
        return len(self.ps_addresses)

    def _place(self, num_workers: int | None, num_ps: int, timeout: float):
        """(PS addresses, worker addresses): PSs on workers of their own when there are
        enough, else sharing workers round-robin."""
        need = (num_workers or 1) + (num_ps if self._owned_cluster is not None else 0)
        with contextlib.suppress(TimeoutError, OSError):
            self.client.wait_for_workers(need, timeout=timeout)
        present = self.present_workers()
        if num_workers is not None and len(present) < num_workers:
            raise ValueError(f"num_workers={num_workers} but the cluster has {len(present)} "
                             f"worker(s) after waiting {timeout:g} s; start more workers or "
                             "ask for fewer")
        if num_ps > len(present):
            raise ValueError(f"num_ps={num_ps} but the cluster has {len(present)} worker(s) "
                             f"after waiting {timeout:g} s: each parameter server needs a worker; "
                             f"allowed: at most {len(present)} (fewer than {len(present)} "
                             "leaves workers that only compute)")
        if len(present) >= num_ps + (num_workers or 1):
            rest = present[num_ps:]
            return present[:num_ps], rest[:num_workers] if num_workers else rest
        return ([present[i % len(present)] for i in range(num_ps)],
                present[:num_workers] if num_workers else present)

    def start_actors(self, settings: PsSettings) -> None:
        """Start the parameter servers, then the workers (which need to know where they are)."""
        self.bounded = settings.bounded
        self.ps_timeout = settings.ps_timeout
        try:
            for i, addr in enumerate(self.ps_addresses):
                key = f"labdist-ps-{self.id}-{i}"
                self._store_futures.append(
                    self._start_actor(ParameterStore, addr, key, i, settings))
                self._store_keys.append(key)
            stores = list(zip(self.ps_addresses, self._store_keys, strict=True))
            for w, addr in enumerate(self.worker_addresses):
                key = f"labdist-psworker-{self.id}-{w}"
                self._worker_futures.append(self._start_actor(
                    ParameterServerWorker, addr, key, w, self.num_workers, stores, settings))
                self._worker_keys.append(key)
            self.client.gather(self._futures)
        except BaseException:
            self.close()
            raise

    # -- lost actors ----------------------------------------------------------------------------
    def store_lost(self, i: int) -> bool:
        return i in self._silent or self.gone(self._store_futures[i])

    def lost_store(self) -> int | None:
        return next((i for i in range(self.num_ps) if self.store_lost(i)), None)

    def worker_lost(self, w: int) -> bool:
        return self.gone(self._worker_futures[w])

    def ps_lost_error(self, i: int | None, detail: str | None = None
                      ) -> ParameterServerLostError:
        where = (f"parameter server {i} (worker {self.ps_addresses[i]})" if i is not None
                 else "a parameter server")
        held = sum(1 for s in self.placement.values() if s == i)
        silent = i in self._silent
        detail = detail or self._silent.get(i, "its worker left the cluster")
        slow = (f" If it is only slow, raise ParameterServerStrategy(ps_timeout=...) (now "
                f"{self.ps_timeout:g} s)." if silent else "")
        return ParameterServerLostError(
            f"{where} was lost ({detail}), and the {held} variable(s) it held with it. "
            "Training cannot go on: close this strategy, start a new one and restore the last "
            f"checkpoint (ld.train.Checkpoint(model=model).restore(directory)).{slow}")

    def silent_error(self, i: int, seconds: float, who: str) -> ParameterServerLostError:
        """Declare parameter server `i` lost because `who` heard nothing from it for
        `seconds` (not even a liveness check): every later call to it fails at once."""
        self._silent.setdefault(
            i, f"it stopped answering: {who} heard nothing from it for {seconds:g} s, neither "
               "a call's reply nor a liveness check's (a stopped or hung process, or a machine "
               "gone from the network)")
        return self.ps_lost_error(i)

    # -- calls --------------------------------------------------------------------------------
    async def _store(self, i: int, method: str, *args, timeout: float | None = None) -> Any:
        """Call store `i`; fails as soon as the scheduler knows its worker is gone (instead of
        Dask retrying the connection for its connect timeout), and once it has answered
        nothing for `ps_timeout` seconds (parameter_server/liveness.py)."""
        def check() -> None:
            if self.store_lost(i):
                raise self.ps_lost_error(i)

        check()
        timeout = self.ps_timeout if timeout is None else timeout
        try:
            return await watched_call(self.client.rpc, self.ps_addresses[i],
                                      self._store_keys[i], method, *args, timeout=timeout,
                                      check=check)
        except Unresponsive as e:
            raise self.silent_error(i, e.seconds, "the driver") from None
        except remote.COMM_ERRORS as e:
            raise self.ps_lost_error(i, f"{type(e).__name__}: {e}") from None

    def store_call(self, i: int, method: str, *args) -> Any:
        return self.client.sync(self._store, i, method, *args)

    def store_call_all(self, method: str, *args, quiet: bool = False) -> list[Any]:
        async def gather():
            return await asyncio.gather(*(self._store(i, method, *args)
                                          for i in range(self.num_ps)),
                                        return_exceptions=quiet)
        return self.client.sync(gather)

    async def call_worker(self, w: int, method: str, *args) -> Any:
        if self.worker_lost(w):
            raise ConnectionError(f"worker {w} ({self.worker_addresses[w]}) left the cluster")
        return await remote.call(self.client.rpc, self.worker_addresses[w],
                                 self._worker_keys[w], method, *args)

    def call_workers(self, workers: list[int], method: str, *args) -> list[Any]:
        async def gather():
            return await asyncio.gather(*(self.call_worker(w, method, *args) for w in workers))
        return self.client.sync(gather)

    def call_live_workers(self, method: str, *args) -> list[Any]:
        """Call every worker not lost (parameter-server training goes on without a lost
        one); a lost worker's place holds None, and one lost during the call too."""
        live = [w for w in range(self.num_workers) if not self.worker_lost(w)]

        async def gather():
            return await asyncio.gather(*(self.call_worker(w, method, *args) for w in live),
                                        return_exceptions=True)

        out: list[Any] = [None] * self.num_workers
        for w, r in zip(live, self.client.sync(gather), strict=True):
            if isinstance(r, BaseException):
                if isinstance(r, remote.COMM_ERRORS) and self.worker_lost(w):
                    continue
                raise r
            out[w] = r
        return out

    def placement_for(self, w: int) -> tuple[int, dict[int, int] | None]:
        """(version, the variable placement when worker `w` has not got that version yet)."""
        with self._lock:
            version = self.placement_version
            return version, (None if self._sent.get(w) == version else dict(self.placement))

    def placement_sent(self, w: int, version: int) -> None:
        with self._lock:
            self._sent[w] = max(self._sent.get(w, -1), version)

    def worker_idle(self, w: int) -> None:
        with contextlib.suppress(Exception):
            self.store_call(0, "ssp_leave", w)

    def worker_gone(self, w: int, live: int) -> None:
        """A lost worker holds no one back: leave the SSP table, release sync barriers."""
        self.worker_idle(w)
        self.release_barriers(live)

    def release_barriers(self, live: int) -> None:
        with contextlib.suppress(Exception):
            self.store_call_all("release_barrier", live, quiet=True)

    # -- the replica-group protocol (strategies/base.py) -----------------------------------
    def create(self, var_id: int, host) -> None:
        with self._lock:
            shard = self._next_shard % self.num_ps
            self._next_shard += 1
        self.store_call(shard, "create", var_id, host)
        self._set_placement(var_id, shard)

    def _set_placement(self, var_id: int, shard: int) -> None:
        with self._lock:
            self.placement[var_id] = shard
            self.placement_version += 1

    def move(self, var_id: int, shard: int) -> None:
        """Put a variable on parameter server `shard` (optimizer slots go next to their
        variable, where the update rule runs)."""
        old = self.placement[var_id]
        if old == shard:
            return
        host = self.store_call(old, "read", var_id)
        self.store_call(shard, "create", var_id, host)
        self._set_placement(var_id, shard)
        self.store_call(old, "delete", [var_id])

    def read(self, var_id: int, ranks) -> list:
        value = self.store_call(self.placement[var_id], "read", var_id)
        return [value for _ in ranks]

    def write(self, var_id: int, mode: str, host, want) -> list:
        value = self.store_call(self.placement[var_id], "write", var_id, mode, host, bool(want))
        return [value for _ in want]

    def update(self, fn, args_r, kwargs_r):
        raise NotImplementedError(
            "strategy.extended.update is not available under ParameterServerStrategy: the "
            "parameter servers hold the only copy; assign the variable directly")

    def where(self, rank: int) -> str:
        return "a parameter-server worker"

    def start_step(self, run_id, fn, args_r, kwargs_r, steps=1, forget=()):
        raise RuntimeError("parameter servers run no steps: their workers run the functions "
                           "ClusterCoordinator.schedule sends them")

    def resume(self, run_id, values, errors, ranks=None):
        raise RuntimeError("parameter servers run no steps: there is no merge_call to resume")

    def reform(self, num_replicas: int | None = None):
        raise RuntimeError("parameter servers are not re-formed: a lost one raises "
                           "ParameterServerLostError (restore from a checkpoint)")

    def scatter(self, arrays: list[Any]) -> None:
        return None  # fit under parameter servers sends each worker its batches

    def lost_replicas(self) -> list[int]:
        return []  # the one "replica" is the PSs' copy: a lost PS raises instead

    def _close_actors(self) -> None:
        """Ask every parameter server still answering to let go, all at once and briefly: a
        frozen one must not hold up close."""
        live = [i for i in range(len(self._store_futures)) if not self.store_lost(i)]
        timeout = min(self.ps_timeout, CLOSE_S)

        async def close_all():
            await asyncio.gather(*(self._store(i, "close", timeout=timeout) for i in live),
                                 return_exceptions=True)
        with contextlib.suppress(Exception):
            self.client.sync(close_all)
