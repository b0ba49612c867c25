"""Parameter-server throughput: updates/s of the 784-512-10 MLP (SGD, batch 64) trained with
`model.fit` under ParameterServerStrategy — one parameter server, 1, 2 and 4 workers, in async,
async + use_locking, sync, and sync with a backup worker — with the torn reads, interleaved
and lost updates, staleness and dropped gradients each run produced. The baseline is the same
layers and optimizer in single-process numpy, measured in the same run.

Run: `python bench/bench_ps.py [--quick]`.

Every configuration runs once per round, right after its own numpy baseline, and rounds repeat
(3, or 1 with --quick): medians of rates and of ratios are reported. One update consumes one
global batch of 64 in every mode (async: one worker's batch; sync: the batch split over the
workers), so updates/s compare like for like. The machine this was written for has 2 cores
shared by the driver, the scheduler, the parameter server and the workers: 4 workers
oversubscribe it, on purpose (that is when staleness shows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from bench_core import _cpu_seconds, cpu_account, machine  # bench/ is on sys.path
from bench_train import numpy_steps_per_s
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


def updates_per_s(client, workers: int, kwargs: dict, x, y):
    """(updates/s of one epoch, its stats), on a fresh strategy after a warm-up."""
    with ld.ParameterServerStrategy(client, num_workers=workers, num_ps=1, **kwargs) as s:
        with s.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(512, activation="relu", input_shape=(784,)),
                ld.layers.Dense(10, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.01))
        model.fit(x[:8 * BATCH], y[:8 * BATCH], batch_size=BATCH, verbose=0)  # warm-up
        s.reset_stats()
        start = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        rate = -(-len(x) // BATCH) / (time.perf_counter() - start)
        return rate, s.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20 steps per configuration, one repetition")
    args = parser.parse_args()
    samples, reps = (20 * BATCH, 1) if args.quick else (100 * BATCH, 3)
    rng = np.random.default_rng(0)
    x = rng.random((samples, 784), dtype=np.float32)
    y = rng.integers(0, 10, samples)
    info = machine()
    before, start = _cpu_seconds(), time.perf_counter()
    cluster = start_local_cluster(5)  # one parameter server + up to 4 workers
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    try:
        # rounds interleave every configuration with its own numpy baseline, so the ratios
        # hold when other work on the machine comes and goes
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in CONFIGS}
        bases, last = [], {}
        for _ in range(reps):
            for label, workers, kwargs in CONFIGS:
                base = numpy_steps_per_s(x, y, BATCH, 40)
                rate, last[label] = updates_per_s(client, workers, kwargs, x, y)
                runs[label].append((rate, rate / base))
                bases.append(base)
        print(f"{'configuration':<42}{'updates/s':>10}{'vs numpy':>9}{'torn reads':>16}"
              f"{'interleaved':>12}{'lost':>6}{'staleness mean/max':>20}{'dropped':>9}")
        print(f"{'numpy, one process (median)':<42}{statistics.median(bases):>10.1f}"
              f"{1:>8.2f}x")
        for label, _, _ in CONFIGS:
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
