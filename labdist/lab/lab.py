"""`ld.Lab`: one training run you can steer while it trains.

The loop runs on a background thread (runner.py), so the notebook stays responsive; the panel
(`lab.show()`) and plain calls (`lab.set(...)`, `lab.run(...)`, `lab.wait()`) do the same
things, so a notebook or a test can drive a lab without a browser.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from labdist import checks
from labdist.cluster.reaper import Lifetime
from labdist.lab.batch_stream import BatchStream
from labdist.lab.config import RunConfig
from labdist.lab.divergence import DivergenceError
from labdist.lab.history import RunHistory
from labdist.lab.models import LabModel, Linear, ParamSpec
from labdist.lab.pool import StrategyPool, check_strategy, strategy_key
from labdist.lab.replicas import ReplicaChanges
from labdist.lab.run_items import RunItem
from labdist.lab.runner import Runner

PAUSE_WITHIN_S = 0.8  # ■ on lab.step / lab.wait: how long the pause may take to land


class Lab:
    """A training run on a strategy's replicas that you can switch mid-run.

    strategy: an `ld.MirroredStrategy` or `ld.ParameterServerStrategy` (used, never closed),
        or None to start a MirroredStrategy of `num_replicas` (default 2) that the lab owns.
        The other kinds are made on the same cluster the first time a switch needs them.
    model: a lab model (`ld.lab.Linear`, `ld.lab.SoftmaxRegression`, `ld.lab.DigitsCNN`,
        `ld.lab.BatchNormMLP`, or a `LabModel`); default `Linear(1)`, whose two parameters
        get a parameter-plane view.
    data: (x, y) arrays (default: the model's own, `LabModel.default_data`: a synthetic
        1-feature regression for `Linear(1)`, the digits for `DigitsCNN`).
    track: parameter elements to chart per replica ("w", "W[3]"); default: the first few.
    global_batch_size: samples per step, split across the replicas in order.
    fault_tolerance: "quorum" makes the lab's own MirroredStrategy quorum-trained: each step
        a transaction over the replicas alive, so `kill_replica` / `add_replica` (and the
        panel's buttons) shrink and grow it mid-run; "none" (default): a lost replica stops
        the run. A strategy you give brings its own mode.
    **settings: the starting RunConfig (kind, synchronization, aggregation, learning_rate,
        skew, delays, use_locking, sync_period, resync, pace, synchronized_bn, latency and
        bandwidth: a slowed-down network, see `ld.NetworkModel`).
    """

    def __init__(self, strategy: Any = None, model: LabModel | None = None,
                 data: tuple[np.ndarray, np.ndarray] | None = None,
                 track: list[str] | None = None, *, num_replicas: int | None = None,
                 global_batch_size: int = 64, seed: int = 0, fault_tolerance: str = "none",
                 **settings: Any):
        model = Linear(1) if model is None else model
        if fault_tolerance not in ("none", "quorum"):
            raise ValueError(f"fault_tolerance={fault_tolerance!r} is not allowed; allowed: "
                             "'none' or 'quorum'")
        if fault_tolerance != "none" and strategy is not None:
            raise ValueError(f"fault_tolerance={fault_tolerance!r} applies to the lab's own "
                             "strategy; make the strategy you give with fault_tolerance="
                             "'quorum' instead")
        if not isinstance(model, LabModel):
            raise TypeError(f"model={model!r} is not a lab model (subclass ld.lab.LabModel: "
                            "init_params() and loss_and_grads(xp, params, x, y)); try "
                            "ld.lab.Linear(1)")
        checks.integer("global_batch_size", global_batch_size, 1)
        x, y = _data(data, model, seed)
        if len(x) < global_batch_size:
            raise ValueError(f"data has {len(x)} samples, fewer than global_batch_size="
                             f"{global_batch_size}")
        spec = ParamSpec.of(model)
        track = model.default_track(spec) if track is None else list(track)
        index = [spec.index(t) for t in track]
        n = _replicas(strategy, num_replicas)
        if global_batch_size < n:
            raise ValueError(f"global_batch_size={global_batch_size} is smaller than the "
                             f"{n} replicas: every replica needs samples")
        key = strategy_key(strategy) if strategy is not None else None
        start = RunConfig(kind=key.kind, use_locking=key.use_locking) if key else RunConfig()
        first = fits_model(start.replace(settings, n), model, spec)  # checked before a cluster
        self.model, self.data, self.track = model, (x, y), track
        self.global_batch_size = global_batch_size
        self._spec = spec
        self._lock = threading.Lock()
        self.panel = None
        self._pool = StrategyPool(strategy, num_replicas, spec.size, fault_tolerance)
        self._replicas = ReplicaChanges(self._pool.first, n)
        self.history = RunHistory(track, index, trainable=spec.trainable)
        self._runner = Runner(self._pool, model, spec, BatchStream(x, y, global_batch_size, seed),
                              first, self.history)
        # a lab nobody holds any more (its cell run again) stops and lets its cluster go
        self._lifetime = Lifetime(self, self._pool)
        self._lifetime.also_close(self._runner.close)
        try:
            runner = self._runner  # the call must not hold the lab (cluster/reaper.py)
            runner.call(lambda: runner.start(first)).result()
        except BaseException:
            self.close()
            raise

    # -- state ----------------------------------------------------------------------------------
    @property
    def config(self) -> RunConfig:
        """The configuration in effect now (queued changes not yet applied are not in it)."""
        return self._runner.config

    @property
    def step_count(self) -> int:
        """Steps completed."""
        return self._runner.completed

    @property
    def state(self) -> str:
        """"idle", "running", "failed", "diverged" (paused at a non-finite step until
        `reset()`) or "closed"."""
        return self._runner.state

    @property
    def error(self) -> BaseException | None:
        """What stopped the run, if it failed (cleared by the next run) or diverged (cleared
        by `reset()`)."""
        return self._runner.error

    @property
    def divergence(self) -> DivergenceError | None:
        """Where the run diverged (a loss or parameter became inf or NaN), until `reset()`."""
        return self._runner.divergence

    @property
    def num_replicas(self) -> int:
        return self._pool.num_replicas

    @property
    def quorum(self) -> bool:
        """Whether the mirrored replicas are quorum-trained (kill_replica / add_replica)."""
        return self._replicas.quorum

    @property
    def replica_slots(self) -> int:
        """The most replicas this run can have (the charts draw a trace for each): the
        starting count, plus `add_replica`'s room in quorum mode."""
        return self._replicas.slots

    @property
    def spec(self) -> ParamSpec:
        """How the model's named parameters pack into one flat vector (`names`, `index("w")`,
        `flatten`, `unflatten`): the layout of every copy in the history and the events."""
        return self._spec

    def pending_config(self) -> RunConfig:
        """The configuration once the queued changes are applied (what `set` builds on, and
        what the controls show)."""
        return self._runner.pending_config()

    @property
    def events(self):
        return list(self.history.events)

    @property
    def strategy(self) -> Any:
        """The strategy the current configuration runs on."""
        return self._pool.strategy(self.config.strategy_key)

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard of the cluster (None when it has none)."""
        return self._pool.dashboard_link

    def steps_per_second(self) -> float:
        return self.history.steps_per_second()

    # -- controls (the panel calls exactly these) -------------------------------------------
    def set(self, **changes: Any) -> None:
        """Queue changes to the run (applied together at the next step boundary, on every
        replica). Checked now: a bad value raises and nothing is queued."""
        if not changes:
            return
        requested = time.time()
        with self._lock:
            pending = self.pending_config()
            new = fits_model(pending.replace(changes, self.num_replicas), self.model,
                             self._spec)
            if new != pending:
                self._runner.enqueue(new, requested)

    def kill_replica(self, rank: int) -> None:
        """SIGKILL replica `rank`'s worker process now (quorum mode, mirrored kinds, on the
        lab's embedded cluster): the step it is in is finished or redone by the others, who
        go on; the cluster's nanny starts a replacement, taken in as it joins. Logged as
        events ("replica 1 lost at step N; ...")."""
        self._check_open()
        self._replicas.check(self.config.kind)
        self._replicas.kill(rank, self.num_replicas)

    def workers_to_poll(self) -> contextlib.AbstractContextManager[list[str]]:
        """The lab cluster's workers a poll of them all may ask now (the panel's timeline),
        steady while it runs: never a worker the lab killed, and no kill in between."""
        return self._replicas.workers_to_poll(self.strategy.client)

    def add_replica(self) -> None:
        """Start one more worker on the lab's cluster (quorum mode): it becomes a replica at
        the next step boundary after it joins, its copies taken from a live peer."""
        self._check_open()
        self._replicas.check(self.config.kind)
        self._replicas.add()

    def run(self, steps: int | None = None) -> None:
        """Train `steps` more steps in the background (None: until `pause()`); returns now.
        A run that diverged raises DivergenceError here until `reset()` (its values are not
        finite: training on would only carry NaN along)."""
        checks.integer("steps", steps, 0, optional=True)
        self._check_open()
        if steps != 0:
            self._runner.add_steps(steps)

    start = run

    def pause(self, wait: bool = True) -> None:
        """Stop at the next step boundary (with `wait`, return once stopped)."""
        self._runner.pause()
        if wait:
            self.wait()

    def step(self, steps: int = 1) -> None:
        """Train `steps` steps and return when they are done (■ pauses the lab, as in
        `wait`)."""
        self.run(steps)
        self.wait()

    def reset(self, wait: bool = True) -> None:
        """Pause, then start again from the model's initial parameters at step 0 (the
        configuration stays)."""
        self._check_open()
        self._runner.pause()
        future = self._runner.call(self._runner.reset)
        if wait:
            future.result()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the steps asked for are done and queued changes applied; raise what
        stopped the run, if something did (DivergenceError when it diverged: the run pauses
        at the first step whose loss or parameters are inf or NaN). TimeoutError after
        `timeout` seconds. An interrupt (■) pauses the run at its next step boundary and
        raises KeyboardInterrupt; ■ in any other cell leaves a running lab running."""
        if timeout is None and self._runner.open_ended:
            raise RuntimeError("this run has no end (run() without steps): pause() it, or "
                               "wait(timeout=...)")
        try:
            done = self._runner.wait(timeout)
        except KeyboardInterrupt:  # ■ on a cell waiting for the run: the run pauses with it
            self._runner.pause()
            self._runner.wait(PAUSE_WITHIN_S)  # at a step boundary, every replica alike
            raise
        if not done:
            raise TimeoutError(f"the lab was still running after timeout={timeout!r} s "
                               f"(step {self.step_count})")
        if self._runner.error is not None:
            raise self._runner.error

    # -- what the run tells (the panel listens through exactly this) --------------------------
    def subscribe(self, callback: Callable[[RunItem], None]) -> Callable[[], None]:
        """Call `callback(item)` for everything the run does from now on; returns a function
        that stops it (as `unsubscribe(callback)` does).

        An item is one of lab/run_items.py's classes (tell them apart with `isinstance` or
        `match`): StepItem (a history row: step, kind, loss, global_loss, spread, tracked,
        contributions, time, plane, ...), EventItem (a change applied: step, text, changes,
        requested, applied, requested_step), PsStatsItem (the parameter servers' counters),
        DivergedItem (step, where, text), ResetItem or ErrorItem. The callback runs on the
        lab's training thread: it should only hand the item on (e.g. put it in a queue),
        never block or raise.
        """
        if not callable(callback):
            raise TypeError(f"callback={callback!r} is not callable; give a function taking "
                            "one item")
        self._runner.subscribe(callback)
        return lambda: self._runner.unsubscribe(callback)

    def unsubscribe(self, callback: Callable[[RunItem], None]) -> None:
        """Stop calling `callback` (nothing happens if it was not subscribed)."""
        self._runner.unsubscribe(callback)

    def values(self) -> list[dict[str, np.ndarray]]:
        """Each replica's parameters now (a parameter-server run: one entry, the PS value),
        read at the next step boundary."""
        self._check_open()
        runner = self._runner
        copies = runner.call(lambda: runner.engine.read_copies()).result()
        return [self._spec.unflatten(c) for c in copies]

    def show(self) -> None:
        """Display the control panel and live charts (in Jupyter)."""
        from IPython.display import display

        from labdist.ui.panel import LabPanel

        if self.panel is None:
            self.panel = LabPanel(self)
        display(self.panel.widget)

    def close(self) -> None:
        """Stop the run and close what the lab started (a strategy it was given stays)."""
        if self.panel is not None:
            self.panel.close()
        self._lifetime.close()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<ld.Lab {self.config.describe()}, {self.num_replicas} replicas, step "
                f"{self.step_count}, {self.state}>")

    def _check_open(self) -> None:
        if self._runner.state == "closed" or self._runner.closing:
            raise RuntimeError("this lab is closed; make a new ld.Lab")


def _replicas(strategy: Any, num_replicas: int | None) -> int:
    if num_replicas is not None and (isinstance(num_replicas, bool)
                                     or not isinstance(num_replicas, int) or num_replicas < 1):
        raise ValueError(f"num_replicas={num_replicas!r} must be an integer >= 1")
    if strategy is None:
        return num_replicas or 2
    check_strategy(strategy)
    if strategy_key(strategy).kind.is_ps:
        return strategy.num_workers
    return strategy.num_replicas_in_sync


def fits_model(config: RunConfig, model: LabModel, spec: ParamSpec) -> RunConfig:
    """`config` if `model` (`spec`: its layout) can run under it: a model with state (batch
    norm) runs mirrored only, and `synchronized_bn` needs batch norm. Returns the config."""
    stateful = bool(spec.state_names)
    if stateful and config.kind.is_ps:
        raise ValueError(f"kind={config.kind.value!r} is not allowed with {model!r}: its "
                         "batch-norm statistics are each replica's own (ON_WRITE / NONE), "
                         "which the lab's parameter servers do not keep; use kind='mirrored'")
    if config.synchronized_bn and not stateful:
        raise ValueError(f"synchronized_bn=True is not allowed with {model!r}: it has no "
                         "batch norm (try ld.lab.BatchNormMLP())")
    return config


def _data(data: Any, model: LabModel, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if data is None:
        found = model.default_data(seed)
        if found is None:
            raise ValueError(f"data=None: {model!r} has no data of its own; give (x, y), or "
                             "use ld.lab.Linear(1) or ld.lab.DigitsCNN(), which have")
        return found
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise TypeError(f"data must be a pair (x, y) of arrays, got {type(data).__name__}")
    x, y = np.asarray(data[0]), np.asarray(data[1])
    if x.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
        raise TypeError(f"data: x and y must be numeric arrays (got {x.dtype}, {y.dtype})")
    if len(x) != len(y):
        raise ValueError(f"data: x has {len(x)} samples but y has {len(y)}")
    model.check_data(x, y)
    return x.astype(np.float64), (y.astype(np.float64) if y.dtype.kind == "f" else y)
