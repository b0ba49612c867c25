"""The lab's *engines*, its two ways of running a step (not to be confused with the array
backends of `labdist.devices`), behind one small interface the runner drives: `Engine`.
`MirroredEngine` lives here; `ps_engine.ParameterServerEngine` is the other one.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from labdist.data.distributed import shard
from labdist.enums import VariableAggregation, VariableSynchronization
from labdist.errors import ReplicaDivergenceWarning
from labdist.lab import communication_engine, replica_steps
from labdist.lab.batch_stream import Batch
from labdist.lab.config import RunConfig
from labdist.lab.models import LabModel, ParamSpec
from labdist.quorum.training import MembershipChange
from labdist.training.metrics import Mean
from labdist.values import PerReplica
from labdist.variables import Variable

Sync = VariableSynchronization
Agg = VariableAggregation


def quiet_divergence() -> None:
    """ON_WRITE + aggregation NONE makes the copies differ on purpose in the lab: its spread
    chart and event log show it, instead of a warning printed from its background thread
    into whichever cell runs then. Only warnings raised from the lab's own calls are
    silenced (installed again by every Lab, idempotently, in case filters were reset)."""
    warnings.filterwarnings("ignore", category=ReplicaDivergenceWarning,
                            module=r"labdist\.lab\.")


class Engine(Protocol):
    """What the runner (lab/runner.py) drives, whichever way the steps run."""

    strategy: Any  # the strategy its steps run on

    def use(self, config: RunConfig, copies: list[np.ndarray]) -> None:
        """Make this engine current, starting from the given per-replica parameter vectors
        (a parameter-server engine takes one vector)."""

    def submit(self, config: RunConfig, batch: Batch, step: int) -> list[StepRecord]:
        """Run (or start) one step; the records of the steps that finished."""

    def configure(self, config: RunConfig) -> None:
        """Settings that change without a switch (delays, apply delay)."""

    def drain(self) -> list[StepRecord]:
        """Finish whatever is in flight (a step boundary); the records of those steps."""

    def leave(self, config: RunConfig) -> None:
        """The copies are about to move to another engine or variable set (a switch): settle
        what `config`'s modes left open first (mirrored: a DiLoCo round, residuals owed)."""

    def fresh(self) -> None:
        """Start the engine's own state afresh (the lab's start and reset)."""

    def copies(self) -> list[np.ndarray]:
        """The per-replica parameter vectors now (at a boundary)."""

    def read_copies(self) -> list[np.ndarray]:
        """The same, read from the variables themselves."""

    def take_changes(self) -> list[tuple[MembershipChange, list[str]]]:
        """Quorum mode's membership changes since the last call, each with the workers
        before it; none elsewhere."""

    def stats(self, force: bool = False) -> dict | None:
        """Parameter servers' counters for the charts (None: nothing new)."""

    def close(self) -> None:
        """Let go of what the engine made (its variables, its coordinator)."""


@dataclass
class StepRecord:
    """What one step did, as the charts and `lab.history` see it."""

    step: int  # steps completed, this one included
    kind: str
    losses: list[float]  # per replica / worker (nan: it did not compute this step)
    sizes: list[int]  # samples each replica / worker used
    values: np.ndarray  # (replicas, parameters): each copy after the step (PS: what it read)
    contributions: int  # gradients applied (one per replica / worker update)
    worker: int | None = None  # async PS: whose update this step is (one worker's, alone)
    # mirrored with a communication mode on: per replica `bytes` sent and error feedback's
    # `residual_norm`; `since` (inner steps into the round), and when a round closed this
    # step, the norms of the averaged pseudo-gradient and of the outer step (else None)
    communication: dict | None = None
    sent: list[int] | None = None  # mirrored: array bytes each replica sent its peers
    # mirrored: the loss tracker's (total, count) per replica, summed since the epoch began
    tracked: list[tuple[float, float]] | None = None
    time: float = field(default_factory=time.time)

    @property
    def global_loss(self) -> float:
        used = [(loss, n) for loss, n in zip(self.losses, self.sizes, strict=True)
                if n and np.isfinite(loss)]
        total = sum(n for _, n in used)
        with np.errstate(all="ignore"):  # near divergence: the runner says so in words
            return float(sum(np.float64(loss) * n for loss, n in used) / total) if total \
                else float("nan")


class MirroredEngine:
    """Steps through `strategy.run` on a MirroredStrategy. Each (synchronization, aggregation)
    has its own set of variables (a variable's semantics are fixed when it is made); switching
    writes the copies into the other set, replica by replica. The model's state (batch norm's
    moving statistics) has one set of its own, ON_WRITE / NONE as TensorFlow makes it, which
    every mode's steps update per replica. A `Mean` metric (Keras' loss tracker, ON_READ /
    SUM) follows the loss: each replica's partial result beside the cross-replica one."""

    kind = "mirrored"

    def __init__(self, strategy, model: LabModel, spec: ParamSpec):
        self.strategy = strategy
        self.model = model
        self.spec = spec
        self.num_replicas = strategy.num_replicas_in_sync
        self._sets: dict[tuple[Sync, Agg], dict[str, Variable]] = {}
        self.variables: dict[str, Variable] | None = None
        self._latest: list[np.ndarray] | None = None  # every copy, as the last step left it
        self.quorum = strategy.fault_tolerance == "quorum"
        self._changes: list[tuple[MembershipChange, list[str]]] = []
        self._workers = list(strategy.workers)
        self._stop_listening = strategy.add_membership_listener(self._heard)
        self.modes = communication_engine.Modes(strategy)
        with strategy.scope():
            self.state = {k: Variable(np.asarray(v, np.float64), name=f"lab/{k}",
                                      synchronization=Sync.ON_WRITE, aggregation=Agg.NONE,
                                      trainable=False)
                          for k, v in model.init_state().items()}
            self.metric = Mean(name="lab/loss")
        quiet_divergence()

    def _variables(self, sync: Sync, agg: Agg) -> dict[str, Variable]:
        key = (sync, agg)
        if key not in self._sets:
            init = self.model.init_params()
            with self.strategy.scope():
                self._sets[key] = {k: Variable(np.asarray(v, np.float64), name=f"lab/{k}",
                                               synchronization=sync, aggregation=agg,
                                               trainable=True)
                                   for k, v in init.items()}
        return self._sets[key]

    def use(self, config: RunConfig, copies: list[np.ndarray]) -> None:
        if not self._sets:  # every set made once, up front: a switch is then one round trip
            for sync in (Sync.ON_WRITE, Sync.ON_READ, Sync.NONE):
                for agg in Agg:
                    self._variables(sync, agg)
        variables = self._variables(config.synchronization, config.aggregation)
        values = [self.spec.unflatten(c) for c in copies]
        first = next(iter(variables.values()))
        self.strategy.extended.update(first, replica_steps.assign_copies,
                                      args=({**variables, **self.state}, PerReplica(values)))
        self.variables = variables
        self._latest = [np.array(c, np.float64) for c in copies]
        self.modes.use(config, variables)

    def copies(self) -> list[np.ndarray]:
        """Every copy now: what the last step returned (exactly what the replicas hold)."""
        return [c.copy() for c in self._latest] if self._latest else self.read_copies()

    def read_copies(self) -> list[np.ndarray]:
        """Every copy, read from the replicas."""
        local = {k: self.strategy.experimental_local_results(v)
                 for k, v in {**self.variables, **self.state}.items()}
        return [self.spec.flatten({k: local[k][r] for k in local})
                for r in range(self.num_replicas)]

    def submit(self, config: RunConfig, batch: Batch, step: int) -> list[StepRecord]:
        x, y = batch.x, batch.y
        average = (config.synchronization is Sync.ON_READ and config.sync_period > 0
                   and step % config.sync_period == 0)
        delays = list(config.delays)
        communicating = self.modes.active  # compression / local SGD on (or a residual owed)
        model = self.model.configured(config.synchronized_bn)
        state, metric, new_epoch = self.state, self.metric, batch.new_epoch

        def args_for(n: int) -> tuple:  # the global batch over n replicas (fewer after a loss)
            xs, ys = PerReplica(shard(x, n)), PerReplica(shard(y, n))
            waits = PerReplica([delays[r] if r < len(delays) else 0.0 for r in range(n)])
            if communicating:
                return (self.variables, state, metric, self.modes.outer, model, xs, ys,
                        config.learning_rate, config.skew, waits,
                        config.aggregation is Agg.MEAN, new_epoch)
            return (self.variables, state, metric, model, xs, ys, config.learning_rate,
                    config.skew, waits, average, new_epoch)

        fn = replica_steps.communicating_step if communicating else replica_steps.mirrored_step
        if self.quorum:  # one transaction over the replicas alive (quorum/training.py)
            columns = list(zip(*self.strategy.run_transaction(fn, args_for, step - 1),
                               strict=True))
        else:
            out = self.strategy.run(fn, args=args_for(self.num_replicas))
            columns = [self.strategy.experimental_local_results(o) for o in out]
        losses, sizes, flats = columns[:3]
        comm = self.modes.record(columns[3]) if communicating else None
        sent = comm["bytes"] if comm is not None else [int(b) for b in columns[3]]
        n = self.num_replicas = len(flats)
        self._latest = [np.array(f, np.float64) for f in flats]
        return [StepRecord(step, self.kind, [float(v) for v in losses], [int(s) for s in sizes],
                           np.stack(flats), contributions=n, communication=comm, sent=sent,
                           tracked=[(float(t), float(c)) for t, c in columns[4]])]

    def take_changes(self) -> list[tuple[MembershipChange, list[str]]]:
        """Quorum mode: the membership changes since the last call, each with the workers
        before it (so a lost worker's replica number can be told)."""
        changes, self._changes = self._changes, []
        return changes

    def _heard(self, change: MembershipChange) -> None:
        self._changes.append((change, self._workers))
        self._workers = list(change.workers)

    def configure(self, config: RunConfig) -> None:
        """The communication modes are set ahead (on the replicas, as a step of their own);
        delays, learning rate and skew travel with every step (the apply delay is a
        parameter-server knob)."""
        self.modes.configure(config)

    def drain(self) -> list[StepRecord]:
        return []

    def fresh(self) -> None:
        """The lab's start and reset: the communication modes start afresh (`Modes.fresh`),
        and the loss tracker from zero on every replica."""
        self.modes.fresh()
        self.metric.reset_state()

    def leave(self, config: RunConfig) -> None:
        """Before a switch reads `copies()`: close a DiLoCo round in progress with its outer
        step and send the error-feedback residuals owed (`Modes.settle`), so the copies that
        move hold every update once (a resync would otherwise average a round's drifted
        copies, skipping the outer step, and the residuals would stay behind)."""
        if self.variables is None:
            return
        settled = self.modes.settle(config, self.variables, self.state)
        if settled is not None:
            self._latest = settled
            self.num_replicas = len(settled)

    def stats(self, force: bool = False) -> dict | None:
        return None

    def close(self) -> None:
        self._stop_listening()
        self.modes.close()
        self.variables = None
