"""Parameter-server throughput: updates/s of the 784-512-10 MLP (SGD, batch 64) trained with
`model.fit` under ParameterServerStrategy — one parameter server, 1, 2 and 4 workers, in async,
async + use_locking, sync, and sync with a backup worker — with the torn reads, interleaved
and lost updates, staleness and dropped gradients each run produced. The baseline is the same
layers and optimizer in single-process numpy, measured in the same run.

Run: `python bench/bench_ps.py [--quick] [--transport auto|tcp|both] [--only TEXT] [--ops]`.

`--transport both` runs every configuration over Dask comms ("tcp") and over the same-host
shared-memory path ("auto", parameter_server/shm_client.py) in the same round, paired; `--only`
keeps the configurations whose label contains TEXT; `--ops` first times one pull and one push
of the MLP's variables (1.6 MB, float32) from a scheduled function, per transport (medians of
300, ms). On a tree without the `transport` knob only "tcp" (its one path) runs.

Every configuration runs once per round, right after its own numpy baseline, and rounds repeat
(3, or 1 with --quick): medians of rates and of ratios are reported. One update consumes one
global batch of 64 in every mode (async: one worker's batch; sync: the batch split over the
workers), so updates/s compare like for like. The machine this was written for has 2 cores
shared by the driver, the scheduler, the parameter server and the workers: 4 workers
oversubscribe it, on purpose (that is when staleness shows).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path
from distributed import Client

import labdist as ld
from labdist.cluster import start_local_cluster

BATCH = 64
CONFIGS = [  # (label, workers, strategy keyword arguments)
    *[(f"async, {w} worker{'s' * (w > 1)}", w, {"mode": "async"}) for w in (1, 2, 4)],
    *[(f"async + use_locking, {w} worker{'s' * (w > 1)}", w,
       {"mode": "async", "use_locking": True}) for w in (2, 4)],
    *[(f"sync, {w} worker{'s' * (w > 1)}", w, {"mode": "sync"}) for w in (1, 2, 4)],
    ("sync, 4 workers, aggregate 3 (1 backup)", 4, {"mode": "sync", "replicas_to_aggregate": 3}),
]


NUMPY_RUNNER = Path(__file__).resolve().parent / "baselines" / "numpy_one.py"


def numpy_steps_per_s(steps: int = 40) -> float:
    """Steps/s of the same MLP in one numpy process (its own interpreter, as bench_train.py
    runs it), so the baseline never shares this process's threads."""
    out = subprocess.run([sys.executable, str(NUMPY_RUNNER), "--batch", str(BATCH),
                          "--steps", str(steps), "--passes", "1", "--warmup", "5"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["steps_per_s"]


HAS_TRANSPORT = "transport" in inspect.signature(ld.ParameterServerStrategy).parameters


def strategy(client, workers: int, kwargs: dict, transport: str):
    if HAS_TRANSPORT:
        kwargs = {**kwargs, "transport": transport}
    return ld.ParameterServerStrategy(client, num_workers=workers, num_ps=1, **kwargs)


def mlp(s, x, y):
    """The 784-512-10 MLP under `s`, fitted on 8 batches (warm-up; binds the optimizer)."""
    with s.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(512, activation="relu", input_shape=(784,)),
            ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.SGD(0.01))
    model.fit(x[:8 * BATCH], y[:8 * BATCH], batch_size=BATCH, verbose=0)
    return model


def _pull_push(weights, n: int) -> tuple[float, float]:
    """On a worker: median ms of one pull of `weights` and one push of their gradients."""
    ctx = ld.get_replica_context()
    ids = [v._id for v in weights]
    grads = {i: np.zeros_like(a) for i, a in ctx.pull(ids).items()}
    pulls, pushes = [], []
    for _ in range(n):
        start = time.perf_counter()
        ctx.pull(ids)
        pulls.append(time.perf_counter() - start)
        items = [(v._id, "gradient", grads[v._id], v.aggregation.name) for v in weights]
        start = time.perf_counter()
        ctx.push(items)
        pushes.append(time.perf_counter() - start)
    return statistics.median(pulls) * 1e3, statistics.median(pushes) * 1e3


def pull_push_ms(client, transport: str, x, y, n: int = 300) -> tuple[float, float]:
    with strategy(client, 1, {"mode": "async"}, transport) as s:
        model = mlp(s, x, y)
        return ld.ClusterCoordinator(s).schedule(_pull_push, args=(model.weights, n)).fetch()


def updates_per_s(client, workers: int, kwargs: dict, x, y, transport: str = "auto"):
    """(updates/s of one epoch, its stats), on a fresh strategy after a warm-up."""
    with strategy(client, workers, kwargs, transport) as s:
        model = mlp(s, x, y)
        s.reset_stats()
        start = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        rate = -(-len(x) // BATCH) / (time.perf_counter() - start)
        return rate, s.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20 steps per configuration, one repetition")
    parser.add_argument("--transport", choices=("auto", "tcp", "both"), default="auto",
                        help="how workers reach the parameter server (both: paired rows)")
    parser.add_argument("--only", default="", help="configurations whose label contains this")
    parser.add_argument("--ops", action="store_true", help="time one pull and one push first")
    args = parser.parse_args()
    samples, reps = (20 * BATCH, 1) if args.quick else (100 * BATCH, 3)
    transports = ["tcp", "auto"] if args.transport == "both" else [args.transport]
    if not HAS_TRANSPORT:
        transports = ["tcp"]
    configs = [(f"{label} [{t}]" if len(transports) > 1 else label, w, kw, t)
               for label, w, kw in CONFIGS if args.only in label for t in transports]
    rng = np.random.default_rng(0)
    x = rng.random((samples, 784), dtype=np.float32)
    y = rng.integers(0, 10, samples)
    info = machine()
    before, start = cpu_seconds(), time.perf_counter()
    cluster = start_local_cluster(5)  # one parameter server + up to 4 workers
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    try:
        # rounds interleave every configuration with its own numpy baseline, so the ratios
        # hold when other work on the machine comes and goes
        for t in transports if args.ops else ():
            for _ in range(reps):
                pull, push = pull_push_ms(client, t, x, y)
                print(f"pull + push of 1.6 MB over {t}: {pull:.3f} + {push:.3f} = "
                      f"{pull + push:.3f} ms")
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, *_ in configs}
        bases, last = [], {}
        for _ in range(reps):
            for label, workers, kwargs, t in configs:
                base = numpy_steps_per_s()
                rate, last[label] = updates_per_s(client, workers, kwargs, x, y, t)
                runs[label].append((rate, rate / base))
                bases.append(base)
        print(f"{'configuration':<42}{'updates/s':>10}{'vs numpy':>9}{'torn reads':>16}"
              f"{'interleaved':>12}{'lost':>6}{'staleness mean/max':>20}{'dropped':>9}")
        print(f"{'numpy, one process (median)':<42}{statistics.median(bases):>10.1f}"
              f"{1:>8.2f}x")
        for label, *_ in configs:
            rate = statistics.median(r for r, _ in runs[label])
            ratio = statistics.median(q for _, q in runs[label])
            st = last[label]
            torn = f"{st.torn_reads}/{st.reads}"
            print(f"{label:<42}{rate:>10.1f}{ratio:>8.2f}x{torn:>16}"
                  f"{st.interleaved_updates:>12}{st.lost_updates:>6}"
                  f"{f'{st.mean_staleness:.2f} / {st.max_staleness}':>20}"
                  f"{st.dropped_stale:>9}")
        print("(medians over rounds; vs numpy: each run over the baseline measured just before "
              "it; counts from the last round)")
    finally:
        client.close()
        cluster.close()
    cpu = cpu_account(before, time.perf_counter() - start)
    print(f"\nmachine: {info['nproc']} cores, {info['cpu_model']}; labdist {info['git']}; "
          f"load average at start {info['loadavg_at_start'][0]:.2f}, at the end "
          f"{os.getloadavg()[0]:.2f}; other processes took {cpu['others_share']:.0%} of the "
          "CPUs during the run (the machine is shared)")


if __name__ == "__main__":
    main()
