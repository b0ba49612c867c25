"""Async parameter servers under `model.fit` with a straggler: does the fast worker keep its
pace, and does the straggler do only its speed's share? (issue 38)

Two workers, one parameter server, the digits MLP (64-64-10, SGD 0.1, batch 64, 1408 examples:
22 updates an epoch). Each round fits once with no straggler and once with worker 1 sleeping
`--delay` s before every push (`set_worker_delay`), on fresh strategies of one cluster. Printed
per run: updates/s of the whole fit, the fast worker's own rate (its updates over the fit's
time), and the straggler's updates against its speed's share (the fit's time over its delay,
the most it could do). The baseline is the same fit with no straggler, in the same round.

Run: `python bench/bench_ps_straggler.py [--rounds 3] [--epochs 8] [--delay 0.1]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

from _machine import machine  # bench/ is on sys.path
from distributed import Client, LocalCluster

import labdist as ld


def fit_once(client, x, y, epochs: int, delay: float) -> dict:
    with ld.ParameterServerStrategy(client, num_workers=2) as strategy:
        with strategy.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(64, activation="relu", input_shape=(64,)),
                ld.layers.Dense(10, activation="softmax")], seed=0)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.1))
        model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)  # warm
        before = dict(strategy.stats().updates_per_worker)
        if delay:
            strategy.set_worker_delay(1, delay)
        start = time.perf_counter()
        model.fit(x, y, batch_size=64, epochs=epochs, verbose=0, shuffle=False)
        seconds = time.perf_counter() - start
        after = strategy.stats().updates_per_worker
    per_worker = [after.get(w, 0) - before.get(w, 0) for w in (0, 1)]
    return {"seconds": seconds, "updates": sum(per_worker), "per_worker": per_worker,
            "updates_per_s": sum(per_worker) / seconds,
            "fast_per_s": per_worker[0] / seconds,
            "straggler_share": (seconds / delay) if delay else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.1)
    args = parser.parse_args()
    (x, y), _ = ld.datasets.digits.load_data()
    x, y = x[:1408], y[:1408]
    print(machine())
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    client = Client(cluster, direct_to_workers=True)
    rows = []
    try:
        for r in range(args.rounds):
            plain = fit_once(client, x, y, args.epochs, 0.0)
            slow = fit_once(client, x, y, args.epochs, args.delay)
            ratio = slow["fast_per_s"] / plain["fast_per_s"]
            rows.append({"plain": plain, "straggler": slow, "fast_ratio": ratio})
            print(f"round {r + 1}: no straggler {plain['updates_per_s']:6.1f} updates/s "
                  f"(worker 0 {plain['fast_per_s']:6.1f}/s, split {plain['per_worker']}); "
                  f"straggler +{args.delay} s: {slow['updates_per_s']:6.1f} updates/s "
                  f"(worker 0 {slow['fast_per_s']:6.1f}/s = {ratio:.2f}x its rate alone; "
                  f"worker 1 did {slow['per_worker'][1]} of {slow['updates']}, its speed "
                  f"allows {slow['straggler_share']:.1f})")
    finally:
        client.close()
        cluster.close()
    print(json.dumps({
        "median_fast_ratio": statistics.median(r["fast_ratio"] for r in rows),
        "median_updates_per_s": {
            k: statistics.median(r[k]["updates_per_s"] for r in rows)
            for k in ("plain", "straggler")},
        "machine_after": machine()}))


if __name__ == "__main__":
    main()
