"""`ParameterStore`: the Dask actor of one parameter-server task. It holds its shard of the
variables (chunked, with version stamps), the optimizer state next to each variable, and applies
what workers push.

Every method is `async def`, so calls from different workers are served concurrently on the
worker's event loop; reads and updates run on the store's own thread pool, so in asynchronous
mode two workers' updates really are applied at the same time, chunk by chunk.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from labdist import aggregation
from labdist.parameter_server.chunked import ChunkedValue, make_kernel
from labdist.parameter_server.compressed_push import unpack
from labdist.parameter_server.counters import StoreCounters
from labdist.parameter_server.push import Push
from labdist.parameter_server.settings import PsSettings
from labdist.parameter_server.shm_server import ShmServer
from labdist.parameter_server.ssp import StalenessBound
from labdist.parameter_server.sync import (
    ACCEPTED,
    COMPLETE,
    DUPLICATE,
    STALE,
    StepUpdate,
    SyncReplicas,
)
from labdist.timing import phases, prometheus

KINDS = ("assign", "assign_add", "assign_sub", "gradient")
INLINE_READ_ELEMENTS = 1 << 20  # reads up to this many elements (4 MB of float32) skip the pool


class ParameterStore:
    """One PS task, started with the strategy's `settings` (settings.py)."""

    def __init__(self, index: int, settings: PsSettings):
        from distributed import get_worker

        self.index = index
        self.address = get_worker().address
        self.mode = settings.mode
        self.use_locking = settings.use_locking
        self.chunk_size = settings.chunk_size
        self.values: dict[int, ChunkedValue] = {}
        self.optimizers: dict[int, tuple[Any, dict[str, int]]] = {}
        self.chunk_delay = 0.0
        self.counters = StoreCounters()
        prometheus.register(self)  # its counters on this worker's /metrics
        self.clock = 0  # pushes applied here (async): what staleness is measured in
        self._clock_lock = threading.Lock()
        self.sync = (SyncReplicas(settings.replicas_to_aggregate) if settings.sync else None)
        self.ssp = (StalenessBound(settings.staleness_bound) if settings.bounded and index == 0
                    else None)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"labdist-ps{index}")
        self._shm: ShmServer | None = None  # made when a worker on this host first asks
        self._closed = False

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _value(self, var_id: int) -> ChunkedValue:
        try:
            return self.values[var_id]
        except KeyError:
            raise ValueError(f"variable #{var_id} is not on parameter server {self.index} "
                             "(created under another strategy, or that strategy was closed)"
                             ) from None

    def specs(self, var_ids: list[int]) -> list[tuple[tuple[int, ...], np.dtype]]:
        """(shape, dtype) of each variable: what a pull of them needs room for."""
        return [(v.shape, v.dtype) for v in map(self._value, var_ids)]

    async def info(self) -> dict:
        return {"address": self.address, "pid": os.getpid(), "index": self.index}

    # -- the driver's calls (cross-replica context) -----------------------------------------
    async def create(self, var_id: int, host: np.ndarray) -> None:
        self.values[var_id] = ChunkedValue(host, self.chunk_size)

    async def delete(self, var_ids: list[int]) -> None:
        for var_id in var_ids:
            self.values.pop(var_id, None)
            self.optimizers.pop(var_id, None)

    async def read(self, var_id: int) -> np.ndarray:
        return (await self._run(self._value(var_id).read))[0]

    async def write(self, var_id: int, mode: str, host: np.ndarray, want: bool):
        value = self._value(var_id)
        _, _, lost = await self._run(value.update, make_kernel(mode, host), self.use_locking)
        self.counters.lost(lost)  # a driver's write can make a concurrent worker update lost
        return (await self._run(value.read))[0] if want else None

    async def bind(self, var_id: int, optimizer: Any, slot_ids: dict[str, int]) -> None:
        """Gradients pushed for `var_id` go through `optimizer`, with these slot variables
        (which must live here too) as its state."""
        value = self._value(var_id)
        for name, slot_id in slot_ids.items():
            if self._value(slot_id).shape != value.shape:
                raise ValueError(f"slot {name!r} (#{slot_id}) does not match variable "
                                 f"#{var_id}'s shape {value.shape}")
        self.optimizers[var_id] = (optimizer, dict(slot_ids))

    async def set_chunk_delay(self, seconds: float) -> None:
        self.chunk_delay = float(seconds)

    async def global_step(self) -> int:
        return self.sync.global_step if self.sync is not None else self.clock

    async def stats(self) -> dict:
        out = self.counters.snapshot()
        out["global_step"] = await self.global_step()
        out["ssp"] = self.ssp.snapshot() if self.ssp is not None else None
        return out

    async def reset_stats(self) -> None:
        self.counters.reset()
        if self.ssp is not None:
            self.ssp.reset()

    async def release_barrier(self, live: int) -> None:
        if self.sync is not None:
            await self.sync.release(live)

    async def sync_waiting(self) -> dict | None:
        """Sync: the open step and who waits at its barrier (SyncReplicas.waiting)."""
        return self.sync.waiting() if self.sync is not None else None

    async def wait_step(self, step: int, key: tuple, release: int) -> str:
        """Sync: after a push whose reply said `wait`, wait until step `step` is applied (the
        barrier; SyncReplicas.wait_barrier). A call of its own, so a pusher waiting here has
        had every push of its function land on every parameter server."""
        return await self.sync.wait_barrier(step, tuple(key), release)

    async def flush_step(self, step: int) -> bool:
        """Sync: apply global step `step` with the pushes it holds (SyncReplicas.flush)."""
        if self.sync is None:
            return False
        new_step = step + 1
        return await self.sync.flush(
            step, lambda batch: self._run(self._apply_batch, batch, new_step))

    async def ssp_begin(self, worker: int) -> float:
        return await self.ssp.begin(worker) if self.ssp is not None else 0.0

    async def ssp_leave(self, worker: int) -> None:
        if self.ssp is not None:
            await self.ssp.leave(worker)

    async def shm_probe(self) -> tuple[str, str, str] | None:
        """What a worker on this host needs to reach this store over shared memory (socket
        path, token file, token), or None where /dev/shm cannot serve (shm_server.py)."""
        if self._shm is None and not self._closed:
            self._shm = ShmServer.start(self, asyncio.get_running_loop())
        return self._shm.probe if self._shm is not None else None

    async def close(self) -> None:
        self._closed = True
        if self._shm is not None:
            self._shm.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the workers' calls -------------------------------------------------------------------
    async def pull(self, var_ids: list[int], step: int | None = None,
                   outs: list[np.ndarray] | None = None):
        """(values, versions, step): copies of the variables, the updates whole in each (what a
        later push quotes as the read its gradient was computed from), and the global step
        (sync: with `step`, wait for that step first — the barrier of step-bound work).
        `outs`: copy into these arrays (the shared-memory path, shm_server.py)."""
        chunks = [self._value(v) for v in var_ids]
        if self.sync is None:
            values, versions, torn = await self._read(chunks, outs)
            at = self.clock
        else:
            at = await self.sync.begin_read(step)
            if at is None:
                return None  # released while waiting for its step: retry this work later
            try:
                values, versions, torn = await self._read(chunks, outs)
            finally:
                await self.sync.end_read()
        self.counters.read(len(var_ids), torn)
        return (dict(zip(var_ids, values, strict=True)),
                dict(zip(var_ids, versions, strict=True)), at)

    def pull_now(self, var_ids: list[int], outs: list[np.ndarray]):
        """Async mode's `pull` on the calling thread (a shared-memory connection's): the same
        lock-free read, clock and counters, without the event loop."""
        values, versions, torn = _read_all([self._value(v) for v in var_ids], outs)
        at = self.clock
        self.counters.read(len(var_ids), torn)
        return (dict(zip(var_ids, values, strict=True)),
                dict(zip(var_ids, versions, strict=True)), at)

    async def _read(self, chunks: list[ChunkedValue], outs: list[np.ndarray] | None = None):
        """Small reads on the event loop (a thread hop costs more than the copy), large ones
        on the pool; either way concurrent with updates, which run on the pool."""
        if sum(c.size for c in chunks) <= INLINE_READ_ELEMENTS:
            return _read_all(chunks, outs)
        return await self._run(_read_all, chunks, outs)

    async def push(self, worker: int, items: list[Push],
                   basis: dict[int, int] | None = None, step: int | None = None,
                   key: tuple | None = None, want: bool = False, examples: float = 1.0) -> dict:
        """Apply one worker's updates (push.py; their values may come compressed). Async: applied
        now; `basis` holds the versions the worker read (none for a blind write). Sync: tagged
        with the global `step` it read and accumulated, standing for `examples` examples in a
        MEAN. When the push did not complete its step, the reply's `wait` is the (step,
        release count) to pass to `wait_step` for the barrier; step-bound work (fit) skips it
        (its next pull waits for the step instead)."""
        items = unpack(items)  # compressed updates, decoded (compressed_push.py)
        self._check(items)
        if self.sync is None:
            return await self._run(self._apply_async, worker, items, basis or {}, want,
                                   (worker, key))
        key = tuple(key) if key else ("blind", id(items))
        at, release = self.sync.global_step, self.sync.release_count
        verdict = self.sync.offer(key, worker, step, items, examples)
        if verdict == STALE:
            self.counters.dropped_stale(worker)
            return {"status": STALE, "global_step": at, "values": None, "wait": None}
        if verdict != DUPLICATE:
            self.counters.applied(worker, 0, 0)  # fresh by definition: staleness 0
        wait = None
        if verdict == COMPLETE:
            new_step = self.sync.global_step + 1
            await self.sync.apply(lambda batch: self._run(self._apply_batch, batch, new_step))
            verdict = ACCEPTED
        else:  # accepted or duplicate (a re-run of work already counted): the step is open
            wait = (at, release)
        values = await self._run(self._values_of, items) if want else None
        return {"status": verdict, "global_step": self.sync.global_step, "values": values,
                "wait": wait}

    def push_now(self, worker: int, items: list[Push],
                 basis: dict[int, int] | None = None, key: tuple | None = None,
                 want: bool = False) -> dict:
        """Async mode's `push` on the calling thread (a shared-memory connection's, one per
        worker, as concurrent as the pool): the same checks and `_apply_async`."""
        items = unpack(items)
        self._check(items)
        return self._apply_async(worker, items, basis or {}, want, (worker, key))

    def _check(self, items: list[Push]) -> None:
        """Validate a whole push before applying any of it (nothing half done)."""
        for push in items:
            var_id, kind = push.var_id, push.kind
            value = self._value(var_id)
            if kind not in KINDS:
                raise ValueError(f"kind={kind!r}; allowed: {', '.join(KINDS)}")
            if np.shape(push.value) != value.shape:
                raise ValueError(f"variable #{var_id}: pushed shape {np.shape(push.value)} but "
                                 f"the variable has shape {value.shape}")
            if kind == "gradient" and var_id not in self.optimizers:
                raise ValueError(f"variable #{var_id}: a gradient was pushed but no optimizer "
                                 "is bound to it on this parameter server")

    def _update(self, var_id: int, kind: str, array: np.ndarray, step: int | None,
                owner: tuple | None = None, basis: int | None = None
                ) -> tuple[bool, int, list]:
        if kind == "gradient":
            optimizer, slot_ids = self.optimizers[var_id]
            slots = {name: self.values[s].array() for name, s in slot_ids.items()}
            kernel = make_kernel(kind, array, optimizer, slots, step)
        else:
            kernel = make_kernel(kind, array)
        return self.values[var_id].update(kernel, self.use_locking, self.chunk_delay, owner,
                                          basis)

    def _apply_async(self, worker, items: list[Push], basis: dict[int, int], want,
                     owner: tuple) -> dict:
        """Apply a push now. Its staleness: the most updates that landed on one of its
        variables between the worker's read and this update's start. `owner` (worker, the
        function's key) made it: what it overwrites of others' is lost (chunked.py)."""
        staleness, interleaved = None, 0
        start = phases.now()
        for push in items:
            var_id = push.var_id
            overlapped, prior, lost = self._update(var_id, push.kind, push.value, None, owner,
                                                   basis.get(var_id))
            interleaved += overlapped
            self.counters.lost(lost)
            if var_id in basis:
                late = max(prior - basis[var_id], 0)
                staleness = late if staleness is None else max(staleness, late)
        with self._clock_lock:
            self.clock += 1
            clock = self.clock
        self.counters.applied(worker, staleness, interleaved)
        phases.RECORDER.add("apply", start, phases.now(), {
            "worker": worker, "staleness": staleness, "flow": phases.flow_id(*owner)})
        return {"status": "applied", "global_step": clock,
                "values": self._values_of(items) if want else None}

    def _apply_batch(self, batch: list[StepUpdate], step: int) -> None:
        for update in batch:
            rule = aggregation.of(update.aggregation)
            for value in rule.ps_values(update.values, update.examples):
                self._update(update.var_id, update.kind, value, step)

    def _values_of(self, items: list[Push]) -> dict[int, np.ndarray]:
        return {p.var_id: self.values[p.var_id].read()[0] for p in items}


def _read_all(chunks: list[ChunkedValue], outs: list[np.ndarray] | None = None
              ) -> tuple[list[np.ndarray], list[int], int]:
    values, versions, torn = [], [], 0
    for i, c in enumerate(chunks):
        value, version, was_torn = c.read(None if outs is None else outs[i])
        values.append(value)
        versions.append(version)
        torn += was_torn
    return values, versions, torn
