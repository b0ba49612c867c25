"""The mirrored strategies' replica group: one Replica actor per worker, placed and called
concurrently from the driver."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import uuid
from typing import Any

from distributed.comm.core import CommClosedError

from labdist import shipping
from labdist.backend import gpu_count
from labdist.cluster.local import connect, start_local_cluster
from labdist.collectives import registry
from labdist.collectives.plugin import PLUGIN_NAME, CollectivePlugin
from labdist.errors import ReplicaLostError
from labdist.worker.lane import LaneClient
from labdist.worker.lane import dumps as lane_dumps
from labdist.worker.replica import Replica, StepEvent

# A replica still running this long after a peer finished is told about it, so a replica
# waiting for a collective its peer will never make fails now instead of at the timeout.
NOTICE_AFTER_S = 0.2


class DaskReplicaGroup:
    """One Replica actor per worker: the replica-group protocol of strategies/base.py."""

    def __init__(self, num_replicas: int | None, cluster: Any, device: str,
                 collective_timeout: float, connect_timeout: float, security: Any = None,
                 transport: str = "auto", knob: tuple[str, str] | None = None):
        self._owned_cluster = None
        self._closed = False
        self._settings = (device, collective_timeout, connect_timeout, security, transport, knob)
        if cluster is None:
            n = num_replicas or (gpu_count() or 2)
            self._owned_cluster = cluster = start_local_cluster(n)
        try:
            self.client, self._owns_client = connect(cluster, connect_timeout, security)
            self.workers = self._pick_workers(num_replicas, connect_timeout)
            self.group = uuid.uuid4().hex
            self.client.register_plugin(CollectivePlugin(), name=PLUGIN_NAME)
            self._futures = [
                self.client.submit(Replica, self.group, rank, self.workers, device,
                                   collective_timeout, actor=True, workers=[addr],
                                   allow_other_workers=False, pure=False,
                                   key=f"labdist-replica-{self.group}-{rank}")
                for rank, addr in enumerate(self.workers)
            ]
            self.client.gather(self._futures)
            self._keys = [f.key for f in self._futures]
            self.infos = self._sync(self._all, "info", [()] * len(self.workers))
            self.transport, self.device_transport = self._choose_transports(
                transport, knob or ("transport", transport))
            self._lanes = self._open_lanes(transport, connect_timeout)
        except BaseException:
            self.close()  # stop whatever replicas started, release what we own
            raise

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
        reached = self._sync(self._all, "transport_connect", [(name, probes)] * n)
        return [r for r, ok in enumerate(reached) if not ok]

    def _open_lanes(self, transport: str, timeout: float) -> list[LaneClient] | None:
        """The fast lane for steps (worker/lane.py), unless told to use Dask comms only or
        the cluster uses TLS; any failure to connect falls back to actor calls."""
        if transport == "tcp":
            return None
        ends = self._sync(self._all, "lane_open", [()] * len(self.workers))
        if None in ends:
            return None
        lanes: list[LaneClient] = []
        try:
            for address, token in ends:
                lanes.append(LaneClient(address, token, timeout))
        except OSError:
            for lane in lanes:
                lane.close()
            return None
        return lanes

    def lost_replicas(self) -> list[int]:
        return [r for r in range(len(self.workers)) if self._lost(r)]

    def present_workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def reform(self, num_replicas: int | None = None) -> DaskReplicaGroup:
        """A new group on the workers present now (at most `num_replicas`), which takes over
        what this one owns (client, embedded cluster); this one is closed."""
        if num_replicas is not None:
            num_replicas = min(num_replicas, len(self.present_workers())) or None
        new = DaskReplicaGroup(num_replicas, self.client, *self._settings)
        new._owned_cluster, self._owned_cluster = self._owned_cluster, None
        new._owns_client, self._owns_client = self._owns_client, False
        self.close()
        return new

    @property
    def num_replicas(self) -> int:
        return len(self.workers)

    @property
    def dashboard_link(self) -> str | None:
        return self.client.dashboard_link if self._owned_cluster is not None else None

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
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        return workers[:num_replicas] if num_replicas else workers

    # -- calls ------------------------------------------------------------------------------------
    def _sync(self, fn, *args):
        return self.client.sync(fn, *args)

    def _lost(self, rank: int) -> bool:
        """The scheduler told the client this replica's worker (and so its actor) is gone."""
        return self._futures[rank].status not in ("finished", "pending")

    def _lost_error(self, rank: int, detail: str) -> ReplicaLostError:
        return ReplicaLostError(
            f"{self.where(rank)} was lost ({detail}), and its variable copies with it. Close "
            "this strategy and start a new one (restore from a checkpoint)")

    async def _call(self, rank: int, method: str, *args) -> Any:
        if self._lost(rank):
            raise self._lost_error(rank, "its worker left the cluster")
        try:
            resp = await self.client.rpc(self.workers[rank]).actor_execute(
                actor=self._keys[rank], function=method,
                args=[shipping.wire(a) for a in args], kwargs={})
        except TypeError as e:
            if "serialize" not in str(e):
                raise
            raise TypeError(
                f"the arguments of {method!r} cannot be sent to {self.where(rank)}: {e}. "
                "Pass arrays, numbers, and picklable objects"
            ) from None
        except (OSError, CommClosedError, KeyError) as e:
            raise self._lost_error(rank, f"{type(e).__name__}: {e}") from None
        if resp["status"] == "OK":
            return resp["result"]
        raise resp["exception"]

    async def _all(self, method: str, args_per_rank: list[tuple], ranks=None) -> list[Any]:
        ranks = range(len(self.workers)) if ranks is None else ranks
        return await asyncio.gather(
            *(self._call(r, method, *a) for r, a in zip(ranks, args_per_rank, strict=True)))

    async def _events(self, run_id: int, method: str, args_per_rank, ranks) -> list[StepEvent]:
        """Each replica's next StepEvent; peers that finished early are announced to the rest."""
        tasks = {asyncio.ensure_future(self._call(r, method, *a)): r
                 for r, a in zip(ranks, args_per_rank, strict=True)}
        events: dict[int, StepEvent] = {}
        announced: set[int] = set()
        pending = set(tasks)
        first = True  # the common case: everyone answers within NOTICE_AFTER_S, in one wait
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=NOTICE_AFTER_S,
                return_when=asyncio.ALL_COMPLETED if first else asyncio.FIRST_COMPLETED)
            timed_out = bool(pending) and (first or not done)
            first = False
            for t in done:
                try:
                    events[tasks[t]] = t.result()
                except Exception as e:  # a lost worker, or an error outside the step itself
                    events[tasks[t]] = StepEvent("error", 0, error=e)
            for t in [t for t in pending if self._lost(tasks[t])]:  # don't wait for a dead worker
                t.cancel()
                pending.discard(t)
                error = self._lost_error(tasks[t], "its worker left the cluster")
                events[tasks[t]] = StepEvent("error", 0, error=error)
            if timed_out and events:
                news = [r for r in events if r not in announced]
                announced.update(news)
                await self._announce(run_id, news, events, [tasks[t] for t in pending])
        return [events[r] for r in ranks]

    # -- the replica-group protocol --------------------------------------------------------------
    def create(self, var_id, host):
        self._sync(self._all, "create", [(var_id, host)] * len(self.workers))

    def read(self, var_id, ranks):
        return self._sync(self._all, "read", [(var_id,)] * len(ranks), ranks)

    def write(self, var_id, mode, host, want):
        n = len(self.workers)
        got = self._sync(self._all, "write", [(var_id, mode, host, r in want) for r in range(n)])
        return [got[r] for r in want]

    def start(self, run_id, fn, args_r, kwargs_r):
        fn_bytes = shipping.dumps(fn)
        n = len(self.workers)
        args = [(run_id, fn_bytes, args_r[r], kwargs_r[r]) for r in range(n)]
        return self._step_events(run_id, "run", args, list(range(n)))

    def resume(self, run_id, values, errors, ranks=None):
        ranks = list(range(len(self.workers))) if ranks is None else ranks
        args = [(values[r], errors[r] if errors else None) for r in ranks]
        return self._step_events(run_id, "resume", args, ranks)

    def _step_events(self, run_id, method, args_per_rank, ranks) -> list[StepEvent]:
        if self._lanes is None:
            return self._sync(self._events, run_id, method, args_per_rank, ranks)
        return self._lane_events(run_id, method, args_per_rank, ranks)

    def _lane_events(self, run_id, method, args_per_rank, ranks) -> list[StepEvent]:
        """`_events` over the lanes: the calling thread talks to the replicas directly."""
        payloads = []
        for r, args in zip(ranks, args_per_rank, strict=True):
            try:
                payloads.append(lane_dumps((method, *args)))
            except Exception as e:
                raise TypeError(f"the arguments of {method!r} cannot be sent to "
                                f"{self.where(r)}: {e}. Pass arrays, numbers, and picklable "
                                "objects") from None
        events: dict[int, StepEvent] = {}
        selector = selectors.DefaultSelector()
        try:
            for r, payload in zip(ranks, payloads, strict=True):
                try:
                    self._lanes[r].send(payload)
                    selector.register(self._lanes[r].sock, selectors.EVENT_READ, r)
                except OSError as e:
                    events[r] = StepEvent("error", 0, error=self._lost_error(r, repr(e)))
            announced: set[int] = set()
            while len(events) < len(ranks):
                ready = selector.select(timeout=NOTICE_AFTER_S)
                for key, _ in ready:
                    r = key.data
                    selector.unregister(key.fileobj)
                    try:
                        events[r] = self._lanes[r].receive()
                    except (OSError, EOFError) as e:
                        events[r] = StepEvent("error", 0, error=self._lost_error(r, repr(e)))
                if ready:
                    continue
                waiting = [r for r in ranks if r not in events]
                for r in waiting:
                    if self._lost(r):  # don't wait for a dead worker
                        selector.unregister(self._lanes[r].sock)
                        error = self._lost_error(r, "its worker left the cluster")
                        events[r] = StepEvent("error", 0, error=error)
                news = [r for r in events if r not in announced]
                if news and len(events) < len(ranks):
                    announced.update(news)
                    self._sync(self._announce, run_id, news, events,
                               [r for r in ranks if r not in events])
        finally:
            selector.close()
        return [events[r] for r in ranks]

    async def _announce(self, run_id, news, events, waiting) -> None:
        await asyncio.gather(*(self._call(w, "peer_state", run_id, r, *_state(events[r]))
                               for w in waiting for r in news), return_exceptions=True)

    def update(self, fn, args_r, kwargs_r):
        fn_bytes = shipping.dumps(fn)
        return self._sync(self._all, "update",
                          [(fn_bytes, a, k) for a, k in zip(args_r, kwargs_r, strict=True)])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if getattr(self, "_keys", None):
            with contextlib.suppress(Exception):
                self._sync(self._all, "close", [()] * len(self.workers))
        self._release()

    def _release(self) -> None:
        for lane in getattr(self, "_lanes", None) or []:
            lane.close()
        self._lanes = None
        futures = getattr(self, "_futures", [])
        client = getattr(self, "client", None)
        if client is not None and futures:
            with contextlib.suppress(Exception):
                client.cancel(futures)
        self._futures = []
        if client is not None and getattr(self, "_owns_client", False):
            with contextlib.suppress(Exception):
                client.close()
        if self._owned_cluster is not None:
            with contextlib.suppress(Exception):
                self._owned_cluster.close()
            self._owned_cluster = None


def _state(event: StepEvent) -> tuple[str, Any]:
    if event.kind == "error":
        return "failed", f"{type(event.error).__name__}: {event.error}"
    return event.kind, event.seq


