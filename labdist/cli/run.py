"""`labdist run`: train a small classifier on the workers of an existing Dask cluster, printing
progress as it goes and a summary at the end.

The same Keras-style `fit` runs under every strategy, in chunks of steps so progress can be
reported between them; what differs is what the summary can say (replica agreement for the
mirrored strategies, staleness and torn reads for the parameter-server ones).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import labdist as ld
from labdist.cli.mistakes import UserError, check_scheduler, connection_error, quiet_teardown

N_FEATURES, N_CLASSES, N_SAMPLES = 16, 4, 8192
REPORTS = 10  # progress lines per run


@dataclass(frozen=True)
class StrategyKind:
    help: str
    make: Callable[[str, Any], ld.Strategy]


def _mirrored(address: str, args) -> ld.Strategy:
    return ld.MirroredStrategy(num_replicas=args.replicas, cluster=address,
                               connect_timeout=args.connect_timeout)


def _multi_worker(address: str, args) -> ld.Strategy:
    return ld.MultiWorkerMirroredStrategy(cluster=address, num_replicas=args.replicas,
                                          connect_timeout=args.connect_timeout)


def _parameter_server(mode: str):
    def make(address: str, args) -> ld.Strategy:
        return ld.ParameterServerStrategy(cluster=address, num_workers=args.replicas,
                                          num_ps=args.num_ps, mode=mode,
                                          connect_timeout=args.connect_timeout)
    return make


STRATEGIES: dict[str, StrategyKind] = {
    "mirrored": StrategyKind("MirroredStrategy, one replica per worker, gradients all-reduced",
                             _mirrored),
    "multi-worker": StrategyKind("MultiWorkerMirroredStrategy over every worker (re-formed "
                                 "when workers come and go)", _multi_worker),
    "parameter-server": StrategyKind("ParameterServerStrategy, asynchronous: workers push "
                                     "when ready (stale gradients, torn reads)",
                                     _parameter_server("async")),
    "sync-replicas": StrategyKind("ParameterServerStrategy with mode='sync' (SyncReplicas: a "
                                  "barrier per step)", _parameter_server("sync")),
}


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = ld.datasets.synthetic.classification(
        n_samples=N_SAMPLES + 1024, n_features=N_FEATURES, n_classes=N_CLASSES, seed=seed)
    return x[:N_SAMPLES], y[:N_SAMPLES], x[N_SAMPLES:], y[N_SAMPLES:]


def make_model(strategy: ld.Strategy, learning_rate: float):
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(64, activation="relu", input_shape=(N_FEATURES,)),
            ld.layers.Dense(N_CLASSES, activation="softmax"),
        ], seed=0)
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.SGD(learning_rate=learning_rate),
                      metrics=["accuracy"])
    return model


def chunks(steps: int, reports: int = REPORTS) -> list[int]:
    """Split `steps` into at most `reports` nearly equal chunks (one progress line each)."""
    n = min(steps, reports)
    size = math.ceil(steps / n)
    out = [size] * (steps // size)
    if steps % size:
        out.append(steps % size)
    return out


def placement(strategy: ld.Strategy) -> tuple[str, str | None]:
    """(the line saying where the strategy runs, a one-line warning or None). A parameter-
    server strategy takes workers away from computing: say which, and warn when only one worker
    is left to compute (nothing to race with, nothing to aggregate)."""
    if not isinstance(strategy, ld.ParameterServerStrategy):
        return f"{strategy!r} on workers {', '.join(strategy.workers)}", None
    workers, servers = strategy.workers, strategy.parameter_servers
    line = (f"{strategy!r}: {len(workers)} worker(s) compute ({', '.join(workers)}), "
            f"{len(servers)} parameter server(s) ({', '.join(servers)})")
    if len(workers) > 1:
        return line, None
    if strategy.mode == "async":
        lacks, more = "no staleness and no interleaved updates", "see workers race"
    else:
        lacks, more = "one gradient per step", "aggregate several workers' gradients"
    return line, (f"only 1 worker computes, so this {strategy.mode} parameter-server run has "
                  f"{lacks}; start more `dask worker` processes (at least "
                  f"{len(servers) + 2}) to {more}")


def train(strategy: ld.Strategy, steps: int, batch_size: int, learning_rate: float,
          say=print) -> dict:
    """Run `steps` optimizer steps of global batch `batch_size`; returns the summary figures."""
    x, y, x_val, y_val = make_data()
    model = make_model(strategy, learning_rate)
    cursor, done, losses = 0, 0, []
    start = time.perf_counter()
    for n in chunks(steps):
        take = n * batch_size
        idx = (cursor + np.arange(take)) % len(x)  # walk the data, wrapping around
        cursor = (cursor + take) % len(x)
        history = model.fit(x[idx], y[idx], batch_size=batch_size, epochs=1, verbose=0,
                            shuffle=False)
        done += n
        logs = {k: v[-1] for k, v in history.history.items()}
        losses.append(float(logs["loss"]))
        if not math.isfinite(losses[-1]):
            raise UserError(f"training diverged: loss {losses[-1]} by step {done} with "
                            f"--learning-rate {learning_rate:g}; use a smaller learning rate")
        rate = done / (time.perf_counter() - start)
        say(f"step {done:>{len(str(steps))}}/{steps}  loss {logs['loss']:.4f}  "
            f"accuracy {logs['accuracy']:.3f}  {rate:.1f} steps/s{_live(strategy)}")
    seconds = time.perf_counter() - start
    val_loss, val_accuracy = model.evaluate(x_val, y_val, batch_size=batch_size, verbose=0)
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
            "examples_per_s": steps * batch_size / seconds, "first_loss": losses[0],
            "loss": losses[-1], "val_loss": float(val_loss),
            "val_accuracy": float(val_accuracy), "replica_gap": _replica_gap(strategy, model)}


def _live(strategy: ld.Strategy) -> str:
    if not isinstance(strategy, ld.ParameterServerStrategy):
        return ""
    s = strategy.stats()
    if strategy.mode == "sync":
        return f"  global step {s.global_step}, stale gradients dropped {s.dropped_stale}"
    return f"  staleness mean {s.mean_staleness:.2f} max {s.max_staleness}"


def _replica_gap(strategy: ld.Strategy, model) -> float | None:
    """Largest difference between two replicas' copies of any weight (mirrored only)."""
    if isinstance(strategy, ld.ParameterServerStrategy):
        return None
    gap = 0.0
    for v in model.weights:
        copies = strategy.experimental_local_results(v)
        gap = max([gap, *(float(np.abs(c - copies[0]).max()) for c in copies)])
    return gap


def summary(strategy: ld.Strategy, address: str, figures: dict, batch_size: int) -> list[str]:
    workers = strategy.workers
    lines = [
        "Summary",
        f"  strategy   {strategy!r} on {address}",
        f"  workers    {len(workers)}: {', '.join(workers)}",
        f"  steps      {figures['steps']} at global batch {batch_size} in "
        f"{figures['seconds']:.2f} s: {figures['steps_per_s']:.1f} steps/s, "
        f"{figures['examples_per_s']:.0f} examples/s",
        f"  loss       {figures['first_loss']:.4f} -> {figures['loss']:.4f}; validation "
        f"loss {figures['val_loss']:.4f}, accuracy {figures['val_accuracy']:.3f}",
    ]
    if figures["replica_gap"] is not None:
        agree = ("identical on every replica" if figures["replica_gap"] == 0 else
                 f"differ by up to {figures['replica_gap']:.3g} between replicas")
        lines.append(f"  weights    {agree}")
    if isinstance(strategy, ld.ParameterServerStrategy):
        lines.append(f"  ps         {strategy.num_ps}: {', '.join(strategy.parameter_servers)}")
        lines += ["  " + line for line in str(strategy.stats()).splitlines()]
    return lines


def check_args(args) -> None:
    """What the run cannot honour, refused before anything connects: a global batch larger
    than the dataset it walks (it would allocate that many examples per step)."""
    if args.batch_size > N_SAMPLES:
        raise UserError(f"--batch-size {args.batch_size} is not allowed; use 1..{N_SAMPLES} "
                        f"(the run trains on a dataset of {N_SAMPLES} examples)")


def run(args) -> int:
    check_args(args)
    address = check_scheduler(args.scheduler, args.connect_timeout)
    kind = STRATEGIES[args.strategy]
    print(f"Connecting to {address} ({args.strategy}) ...", flush=True)
    try:
        strategy = kind.make(address, args)
    except ld.ClusterConnectionError as e:
        raise connection_error(e) from None
    except (ValueError, TypeError) as e:  # e.g. more replicas than the cluster has workers
        raise UserError(str(e)) from None
    try:
        where, warning = placement(strategy)
        print(where, flush=True)
        if warning is not None:
            print(f"labdist run: warning: {warning}", file=sys.stderr, flush=True)
        figures = train(strategy, args.steps, args.batch_size, args.learning_rate,
                        say=lambda line: print(line, flush=True))
        print("\n".join(summary(strategy, address, figures, args.batch_size)), flush=True)
    except ld.LabdistError as e:  # a lost worker, a collective that timed out
        quiet_teardown()
        raise UserError(f"{type(e).__name__}: {e}") from None
    finally:
        strategy.close()
    return 0
