"""The lab's parameter-server backend: each step is one *round*, a function per worker scheduled
through `ld.ClusterCoordinator`; each pulls the parameters, computes the gradient on its own
shard of the global batch and pushes the update.

- async: up to `WINDOW` rounds are in flight at once, so a fast worker reads values while
  others' updates land (staleness, torn reads); a round is recorded when all of its functions
  have finished. A boundary (`drain`) waits for every round in flight: nothing is lost or
  applied twice across a switch.
- sync: the round's pushes meet at the parameter servers' barrier and become one update (the
  variables' aggregation), one global step per round.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, deque

import numpy as np

from labdist.enums import VariableAggregation
from labdist.lab import steps
from labdist.lab.backends import StepRecord, shard_bounds
from labdist.lab.config import RunConfig
from labdist.lab.models import LabModel, ParamSpec
from labdist.variables import Variable

Agg = VariableAggregation
WINDOW = 2  # async rounds in flight
STATS_EVERY_S = 0.1  # how often the parameter servers' counters are fetched while running


class ParameterServerBackend:
    def __init__(self, strategy, model: LabModel, spec: ParamSpec):
        from labdist.parameter_server import ClusterCoordinator

        self.strategy = strategy
        self.kind = "ps_" + strategy.mode
        self.model = model
        self.spec = spec
        self.num_replicas = strategy.num_workers
        self.coordinator = ClusterCoordinator(strategy)
        self._sets: dict[Agg, dict[str, Variable]] = {}
        self.variables: dict[str, Variable] | None = None
        self._rounds: deque = deque()
        self._views: np.ndarray | None = None
        self._losses = [float("nan")] * self.num_replicas
        self._delays: tuple[float, ...] = ()
        self._stats_base: dict | None = None
        self._stats_at = 0.0

    def _variables(self, agg: Agg) -> dict[str, Variable]:
        if agg not in self._sets:
            init = self.model.init_params()
            with self.strategy.scope():
                self._sets[agg] = {k: Variable(np.asarray(v, np.float64), name=f"lab/{k}",
                                               aggregation=agg)
                                   for k, v in init.items()}
        return self._sets[agg]

    def use(self, config: RunConfig, copies: list[np.ndarray]) -> None:
        (value,) = copies
        variables = self._variables(config.aggregation)
        with self.strategy.scope():
            for k, v in self.spec.unflatten(value).items():
                variables[k].assign(v, read_value=False)
        self.variables = variables
        self._views = np.tile(value, (self.num_replicas, 1))
        self._losses = [float("nan")] * self.num_replicas
        self.configure(config)
        self._stats_base = self._snapshot()

    def configure(self, config: RunConfig) -> None:
        """Settings that change without a switch: the stragglers' delays."""
        for w, d in enumerate(config.delays):
            if w >= len(self._delays) or self._delays[w] != d:
                self.strategy.set_worker_delay(w, d)
        self._delays = tuple(config.delays)

    def copies(self) -> list[np.ndarray]:
        """The parameter servers' value (one vector)."""
        with self.strategy.scope():
            return [self.spec.flatten({k: v.read_value() for k, v in self.variables.items()})]

    read_copies = copies

    def submit(self, config: RunConfig, batch, step: int) -> list[StepRecord]:
        x, y = batch
        bounds = shard_bounds(len(x), self.num_replicas)
        args = (self.variables, self.model, x, y, bounds, config.learning_rate, config.skew)
        values = [self.coordinator.schedule(steps.ps_step, args=args)
                  for _ in range(self.num_replicas)]
        self._rounds.append((step, values))
        done = []
        while self._rounds and (len(self._rounds) > WINDOW or self.kind == "ps_sync"
                                or all(v.done() for v in self._rounds[0][1])):
            done.append(self._finish(*self._rounds.popleft()))
        return done

    def _finish(self, step: int, values) -> StepRecord:
        try:
            results = [v.fetch() for v in values]  # raises a function's error
        except BaseException:
            self._abandon()
            raise
        sizes = [0] * self.num_replicas
        for w, loss, n, flat in results:  # a worker that ran twice in a round: its last
            self._views[w] = flat
            self._losses[w] = loss
            sizes[w] += n
        return StepRecord(step, self.kind, list(self._losses), sizes, self._views.copy(),
                          contributions=len(results))

    def _abandon(self) -> None:
        """After a function failed: forget the rounds in flight (the coordinator cancelled
        what was queued) so the next run starts clean."""
        for _, values in self._rounds:
            for v in values:
                with contextlib.suppress(BaseException):
                    v.fetch()
        self._rounds.clear()
        with contextlib.suppress(BaseException):
            self.coordinator.join()  # TF raises a failure once: here, not on the next run

    def drain(self) -> list[StepRecord]:
        done = [self._finish(*self._rounds.popleft()) for _ in range(len(self._rounds))]
        self.coordinator.join()
        return done

    def _snapshot(self) -> dict:
        s = self.strategy.stats()
        return {"staleness": dict(s.staleness), "torn_reads": s.torn_reads,
                "lost_updates": s.lost_updates, "updates": s.updates, "dropped": s.dropped_stale}

    def stats(self, force: bool = False) -> dict | None:
        """The counters since this backend became current: {"staleness": {s: n},
        "torn_reads", "lost_updates", "updates", "dropped"} (None when fetched too recently)."""
        now = time.monotonic()
        if not force and now - self._stats_at < STATS_EVERY_S:
            return None
        self._stats_at = now
        snap, base = self._snapshot(), self._stats_base or {}
        hist = Counter(snap["staleness"])
        hist.subtract(base.get("staleness", {}))
        return {"staleness": {k: v for k, v in sorted(hist.items()) if v},
                **{k: snap[k] - base.get(k, 0)
                   for k in ("torn_reads", "lost_updates", "updates", "dropped")}}

    def close(self) -> None:
        self.variables = None
