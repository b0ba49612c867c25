"""Quorum training (issue 29): what one lost worker costs, and what quorum mode costs when
nothing fails.

1. Recovery. The same run (digits, Dense 256 relu + softmax, Adam, batch 64, 12 epochs, one
   replica per `dask worker --no-nanny` process, 3 workers) with worker 1 SIGKILLed 40 % into
   epoch 6, recovered three ways: (a) `fault_tolerance="quorum"`; (b) `BackupAndRestore` with
   its checkpoint at every epoch end, `fit` called again (MultiWorkerMirroredStrategy re-forms
   on the 2 survivors); (c) a new strategy and model on the survivors, trained from scratch.
   Reported: optimizer steps lost (done before the kill and done again, or undone and re-run)
   and the time to recover: from the kill until training has done one step more than it had
   when the kill came (every fit group's end is timestamped). Scenarios are interleaved, a new
   order each round; a run without a kill is in every round for reference.
2. Overhead. Two strategies on the same 3 workers (3 replicas each), one with quorum mode,
   one without, train the same model in alternation (one epoch each, the order swapped every
   pair); the figure is the median of the per-pair ratios of steps/s (quorum / plain), for
   digits (as above) and the 784-512-10 MLP on random data, at steps_per_execution 1 and 10.

Run: `python bench/bench_quorum.py [--rounds N] [--pairs N] [--json PATH]`. Shared machine:
only the ratios and the paired figures mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path as a script
from distributed import Client

import labdist as ld

DASK = str(Path(sys.executable).parent / "dask")
EPOCHS, KILL_EPOCH, KILL_AT, BATCH = 12, 6, 0.4, 64


class Cluster:
    """A `dask scheduler` and `dask worker --no-nanny` processes (a kill is for good)."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        self.procs = [self._spawn([DASK, "scheduler", "--host", "127.0.0.1", "--port",
                                   str(port), "--no-dashboard", "--idle-timeout", "300s"])]
        self.client = None
        for _ in range(300):
            try:
                self.client = Client(self.address, timeout=5, set_as_default=False)
                break
            except OSError:
                time.sleep(0.2)

    @staticmethod
    def _spawn(cmd):
        # what Dask's nanny would set: one BLAS thread per worker process (without it, two
        # replicas' BLAS threads fight over 2 cores and a step takes 10x longer)
        env = {**os.environ, **dict.fromkeys(
            ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")}
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)

    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def ensure(self, n: int) -> None:
        """Exactly n workers (start the missing ones; retire extra ones)."""
        have = len(self.workers())
        for _ in range(n - have):
            self.procs.append(self._spawn([DASK, "worker", self.address, "--host", "127.0.0.1",
                                           "--nthreads", "1", "--no-nanny", "--no-dashboard"]))
        while len(self.workers()) < n:
            time.sleep(0.1)
        extra = self.workers()[n:]
        if extra:
            self.client.retire_workers(extra, close_workers=True)
            while len(self.workers()) > n:
                time.sleep(0.1)

    def pid_of(self, address: str) -> int:
        return self.client.run(os.getpid, workers=[address])[address]

    def close(self):
        with contextlib.suppress(Exception):
            self.client.close()
        for p in self.procs[::-1]:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(15)


def digits_model(strategy, hidden=256, features=64):
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(hidden, activation="relu", input_shape=(features,)),
            ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam(),
                      metrics=["accuracy"])
    return model


class Killer(ld.callbacks.Callback):
    def __init__(self, pid: int, delay: float):
        self.pid, self.delay, self.at = pid, delay, None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == KILL_EPOCH and self.pid:
            def later():
                time.sleep(self.delay)
                self.at = time.monotonic()
                os.kill(self.pid, signal.SIGKILL)
            threading.Thread(target=later, daemon=True).start()


def timed(strategy, log: list) -> None:
    """Record (time, optimizer steps done) after each of `strategy`'s fit groups."""
    train = strategy.train_model_steps

    def wrapper(step, groups, first_iteration):
        done = first_iteration
        for group, out in zip(groups, train(step, groups, first_iteration), strict=False):
            done += len(group)
            log.append((time.monotonic(), done))
            yield out

    strategy.train_model_steps = wrapper


def recovery(log: list, steps_lost: int) -> dict:
    """The stall (the longest gap between two fit steps ending, less a normal step: the
    detection, re-forming and restarting) and the time to redo the steps lost at the median
    step time; their sum is the time the kill cost."""
    times = [t for t, _ in log]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    step_s = statistics.median(gaps)
    stall = max(gaps) - step_s
    return {"stall_s": stall, "step_s": step_s, "recover_s": stall + steps_lost * step_s}


def scenario(cluster: Cluster, kind: str, epoch_s: float, data) -> dict:
    (x, y), (xv, yv) = data
    cluster.ensure(3)
    steps_per_epoch = -(-len(x) // BATCH)
    quorum = {"fault_tolerance": "quorum"} if kind == "quorum" else {}
    strategy = ld.MultiWorkerMirroredStrategy(cluster.address, collective_timeout=20, **quorum)
    model = digits_model(strategy)
    log: list = []
    timed(strategy, log)
    pid = cluster.pid_of(strategy.workers[1]) if kind != "none" else 0
    killer = Killer(pid, KILL_AT * epoch_s)
    backup = Path(tempfile.mkdtemp()) / "backup"
    callbacks = [killer] + ([ld.callbacks.BackupAndRestore(str(backup))]
                            if kind == "backup" else [])
    out = {"kind": kind, "steps_lost": 0}
    start = time.monotonic()
    try:
        model.fit(x, y, epochs=EPOCHS, batch_size=BATCH, verbose=0, callbacks=callbacks)
    except ld.ReplicaLostError:
        done = model._iterations
        while len(cluster.workers()) > 2:  # refresh() re-forms once the scheduler knows
            time.sleep(0.02)
        if kind == "backup":
            out["steps_lost"] = done - KILL_EPOCH * steps_per_epoch
            model.fit(x, y, epochs=EPOCHS, batch_size=BATCH, verbose=0, callbacks=callbacks)
        else:  # from scratch, on the workers left
            out["steps_lost"] = done
            strategy.close()
            strategy = ld.MultiWorkerMirroredStrategy(cluster.address, collective_timeout=20)
            timed(strategy, log)
            model = digits_model(strategy)
            model.fit(x, y, epochs=EPOCHS, batch_size=BATCH, verbose=0)
    out["wall_s"] = time.monotonic() - start
    if kind == "quorum":
        changes = strategy.membership_changes
        out["pause_s"] = max(c.paused_s for c in changes) if changes else None
        out["steps_lost"] = sum(1 for c in changes if c.retried)  # steps undone and re-run
    if kind != "none":
        out.update(recovery(log, out["steps_lost"]))
    out["val_accuracy"] = model.evaluate(xv, yv, verbose=0, return_dict=True)["accuracy"]
    strategy.close()
    return out


def snapshot_ms(hidden: int, features: int) -> float:
    """What quorum mode adds to every run on each replica: UndoLog.keep of the model's
    weights and Adam's two slots (median of 200, in this process)."""
    from labdist.quorum.undo import UndoLog

    shapes = [(features, hidden), (hidden,), (hidden, 10), (10,)]
    values = {i: np.ones(shape, np.float32) for i, shape in enumerate(shapes * 3)}
    log = UndoLog()
    log.keep(values, 0)
    times = []
    for run in range(1, 201):
        t = time.perf_counter()
        log.keep(values, run)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def overhead(cluster: Cluster, pairs: int) -> list[dict]:
    cluster.ensure(3)
    rng = np.random.default_rng(0)
    mlp = (rng.standard_normal((4096, 784), dtype=np.float32),
           rng.integers(0, 10, 4096).astype(np.int64))
    digits = ld.datasets.digits.load_data()[0]
    rows = []
    plain = ld.MultiWorkerMirroredStrategy(cluster.address)
    quorum = ld.MultiWorkerMirroredStrategy(cluster.address, fault_tolerance="quorum")
    try:
        for name, (x, y), hidden in (("digits 64-256-10", digits, 256),
                                     ("mlp 784-512-10", mlp, 512)):
            for spe in (1, 10):
                models = {}
                for key, s in (("plain", plain), ("quorum", quorum)):
                    m = digits_model(s, hidden, x.shape[1])
                    m.compile(loss="sparse_categorical_crossentropy",
                              optimizer=ld.optimizers.Adam(), steps_per_execution=spe)
                    m.fit(x, y, epochs=1, batch_size=BATCH, verbose=0)  # warm
                    models[key] = m
                steps = -(-len(x) // BATCH)
                ratios, rates = [], {"plain": [], "quorum": []}
                for i in range(pairs):
                    got = {}
                    for key in (("plain", "quorum") if i % 2 else ("quorum", "plain")):
                        t = time.perf_counter()
                        models[key].fit(x, y, epochs=1, batch_size=BATCH, verbose=0)
                        got[key] = steps / (time.perf_counter() - t)
                        rates[key].append(got[key])
                    ratios.append(got["quorum"] / got["plain"])
                rows.append({"model": name, "steps_per_execution": spe,
                             "snapshot_ms_per_run": snapshot_ms(hidden, x.shape[1]),
                             "plain_steps_s": statistics.median(rates["plain"]),
                             "quorum_steps_s": statistics.median(rates["quorum"]),
                             "ratio_median": statistics.median(ratios),
                             "ratio_q1_q3": statistics.quantiles(ratios, n=4)[::2]})
                print(rows[-1], flush=True)
    finally:
        plain.close()
        quorum.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", choices=("recovery", "overhead"))
    args = parser.parse_args()
    data = ld.datasets.digits.load_data()
    before, t0 = cpu_seconds(), time.monotonic()
    cluster = Cluster()
    try:
        cluster.ensure(3)
        with ld.MultiWorkerMirroredStrategy(cluster.address) as s:  # an epoch's duration
            m = digits_model(s)
            m.fit(*data[0], epochs=1, batch_size=BATCH, verbose=0)
            t = time.monotonic()
            m.fit(*data[0], epochs=2, batch_size=BATCH, verbose=0)
            epoch_s = (time.monotonic() - t) / 2
        runs = []
        for r in range(args.rounds if args.only != "overhead" else 0):
            kinds = ["none", "quorum", "backup", "scratch"]
            random.Random(r).shuffle(kinds)
            for kind in kinds:
                runs.append({"round": r, **scenario(cluster, kind, epoch_s, data)})
                print(runs[-1], flush=True)
        summary: dict[str, list] = {}
        for x in runs:
            if x["kind"] != "none":
                summary.setdefault(x["kind"], []).append(x)
        table = {k: {"steps_lost": [v["steps_lost"] for v in vals],
                     "recover_s_median": statistics.median(v["recover_s"] for v in vals),
                     "recover_s_all": [round(v["recover_s"], 2) for v in vals],
                     "stall_s_all": [round(v["stall_s"], 2) for v in vals],
                     "wall_s_all": [round(v["wall_s"], 2) for v in vals]}
                 for k, vals in summary.items()}
        table["none"] = {"wall_s_all": [round(x["wall_s"], 2) for x in runs
                                        if x["kind"] == "none"]}
        print(json.dumps(table, indent=1))
        rows = overhead(cluster, args.pairs) if args.only != "recovery" else []
    finally:
        cluster.close()
    report = {"machine": machine(), "epoch_s": epoch_s, "recovery": table, "runs": runs,
              "overhead": rows,
              "cpu": cpu_account(before, time.monotonic() - t0)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
