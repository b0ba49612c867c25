"""The lab's parameter-server engine. The model's parameters live on the parameter server as
one flat vector, applied chunk by chunk (the lab's own strategies: up to 4 chunks, `w` and `b`
apart for `Linear(1)`).

- async: each worker loops on its own: pull, compute on its shard of a global batch, push. The
  engine keeps one function per worker in flight, plus `AHEAD` queued for whichever worker
  frees up first, and schedules the next as soon as one finishes; a lab step is one applied
  update (one worker's), recorded when it finishes. A straggler delays only its own updates;
  the others' keep landing, so its pushes arrive stale (the staleness histogram shows it).
- sync: a step is a round of one function per worker whose pushes meet at the parameter
  servers' barrier and become one update (the variable's aggregation). With backup workers
  (a strategy with replicas_to_aggregate < workers) the first gradients make the update and
  the late ones are dropped (counted: "dropped stale"); the round still ends when every
  function of it has returned.

A boundary (`drain`) waits for every function in flight and records it: nothing is lost or
applied twice across a switch.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import numpy as np

from labdist.data.distributed import shard_bounds
from labdist.enums import VariableAggregation
from labdist.lab import replica_steps
from labdist.lab.batch_stream import Batch
from labdist.lab.config import Kind, RunConfig
from labdist.lab.engines import StepRecord
from labdist.lab.models import LabModel, ParamSpec
from labdist.variables import Variable

Agg = VariableAggregation
AHEAD = 1  # async: functions queued beyond one per worker, so a free worker never idles
POLL_S = 0.002  # how often the engine looks for a finished function
STATS_EVERY_S = 0.1  # how often the parameter servers' counters are fetched while running


class ParameterServerEngine:
    def __init__(self, strategy, kind: Kind, model: LabModel, spec: ParamSpec):
        """`kind`: the lab's own name for the strategy's mode (PS_ASYNC or PS_SYNC), as the
        pool made the strategy from it: kept, not read back from the strategy's string."""
        from labdist.parameter_server import ClusterCoordinator

        self.strategy = strategy
        self.kind = kind
        self.model = model
        self.spec = spec
        self.num_replicas = strategy.num_workers
        self.coordinator = ClusterCoordinator(strategy)
        self._sets: dict[Agg, Variable] = {}
        self.variable: Variable | None = None
        self._in_flight: list = []  # async: RemoteValues, in schedule order
        self._views = np.zeros((self.num_replicas, spec.size))
        self._losses = [float("nan")] * self.num_replicas
        self._sizes = [0] * self.num_replicas
        self._delays: tuple[float, ...] = ()
        self._apply_delay: float | None = None
        self._stats_base: dict | None = None
        self._stats_at = 0.0

    def _variable(self, agg: Agg) -> Variable:
        if agg not in self._sets:
            with self.strategy.scope():
                self._sets[agg] = Variable(self.spec.flatten(self.model.init_params()),
                                           name="lab/params", aggregation=agg)
        return self._sets[agg]

    def use(self, config: RunConfig, copies: list[np.ndarray]) -> None:
        (value,) = copies
        variable = self._variable(config.aggregation)
        with self.strategy.scope():
            variable.assign(np.asarray(value, np.float64), read_value=False)
        self.variable = variable
        self._views = np.tile(value, (self.num_replicas, 1))
        self._losses = [float("nan")] * self.num_replicas
        self._sizes = [0] * self.num_replicas
        self.configure(config)
        self._stats_base = self._snapshot()

    def configure(self, config: RunConfig) -> None:
        """Settings that change without a switch: the stragglers' delays, the apply delay."""
        for w, d in enumerate(config.delays):
            if w >= len(self._delays) or self._delays[w] != d:
                self.strategy.set_worker_delay(w, d)
        self._delays = tuple(config.delays)
        if config.apply_delay != self._apply_delay:
            self.strategy.set_chunk_delay(config.apply_delay)
            self._apply_delay = config.apply_delay

    def copies(self) -> list[np.ndarray]:
        """The parameter servers' value (one vector)."""
        with self.strategy.scope():
            return [np.asarray(self.variable.read_value(), np.float64).copy()]

    read_copies = copies

    def take_changes(self) -> list:
        return []  # parameter servers do not change membership

    def submit(self, config: RunConfig, batch: Batch, step: int) -> list[StepRecord]:
        x, y = batch.x, batch.y
        bounds = shard_bounds(len(x), self.num_replicas)
        args = (self.variable, self.spec, self.model, x, y, bounds, config.learning_rate,
                config.skew)
        if self.kind is Kind.PS_SYNC:  # a round: every worker's push meets at the barrier
            values = [self.coordinator.schedule(replica_steps.ps_step, args=args)
                      for _ in range(self.num_replicas)]
            return [self._round(self._fetch(values))]
        self._in_flight.append(self.coordinator.schedule(replica_steps.ps_step, args=args))
        while len(self._in_flight) >= self.num_replicas + AHEAD \
                and not any(v.done() for v in self._in_flight):
            time.sleep(POLL_S)
        done = [v for v in self._in_flight if v.done()]
        self._in_flight = [v for v in self._in_flight if not v.done()]
        return [self._update(r) for r in self._fetch(done)]

    def _fetch(self, values: list) -> list[tuple]:
        try:
            return [v.fetch() for v in values]  # raises a function's error
        except BaseException:
            self._abandon()
            raise

    def _seen(self, w: int, loss: float, n: int, flat: np.ndarray) -> None:
        self._views[w], self._losses[w], self._sizes[w] = flat, loss, n

    def _update(self, result: tuple) -> StepRecord:
        """One worker's applied update (async): the losses and sizes are each worker's
        latest, so the global loss weighs every worker's last shard."""
        self._seen(*result)
        return StepRecord(0, self.kind, list(self._losses), list(self._sizes),
                          self._views.copy(), contributions=1, worker=result[0])

    def _round(self, results: list[tuple]) -> StepRecord:
        sizes = [0] * self.num_replicas
        for w, loss, n, flat in results:  # a worker that ran twice in a round: its last
            self._seen(w, loss, n, flat)
            sizes[w] += n
        aggregated = self.strategy.replicas_to_aggregate or len(results)
        return StepRecord(0, self.kind, list(self._losses), sizes, self._views.copy(),
                          contributions=min(len(results), aggregated))

    def _abandon(self) -> None:
        """After a function failed: forget what is in flight (the coordinator cancelled what
        was queued) so the next run starts clean."""
        for v in self._in_flight:
            with contextlib.suppress(BaseException):
                v.fetch()
        self._in_flight.clear()
        with contextlib.suppress(BaseException):
            self.coordinator.join()  # TF raises a failure once: here, not on the next run

    def fresh(self) -> None:
        """The lab's reset: nothing carried between steps here (pushes are not compressed in
        the lab)."""

    def leave(self, config: RunConfig) -> None:
        """Nothing to settle before a switch: pushes are not compressed in the lab."""

    def drain(self) -> list[StepRecord]:
        values, self._in_flight = self._in_flight, []
        done = [self._update(r) for r in self._fetch(values)]
        self.coordinator.join()
        return done

    def _snapshot(self) -> dict:
        s = self.strategy.stats()
        return {"staleness": dict(s.staleness), "torn_reads": s.torn_reads,
                "lost_updates": s.lost_updates, "updates": s.updates, "dropped": s.dropped_stale,
                "reads": s.reads}

    def stats(self, force: bool = False) -> dict | None:
        """The counters since this engine became current: {"staleness": {s: n},
        "torn_reads", "lost_updates", "updates", "dropped", "reads"} (None when fetched too
        recently)."""
        now = time.monotonic()
        if not force and now - self._stats_at < STATS_EVERY_S:
            return None
        self._stats_at = now
        snap, base = self._snapshot(), self._stats_base or {}
        hist = Counter(snap["staleness"])
        hist.subtract(base.get("staleness", {}))
        return {"staleness": {k: v for k, v in sorted(hist.items()) if v},
                **{k: snap[k] - base.get(k, 0)
                   for k in ("torn_reads", "lost_updates", "updates", "dropped", "reads")}}

    def close(self) -> None:
        self.variable = None
