"""Where a training step's time goes: `fit` (steps_per_execution 1 and 10) and a README-style
custom loop (`strategy.run` per step), MLP 784-512-10, global batch 64 (`--batch`), 2 replicas.

Timing spans (bench/_spans.py) are patched into the driver and into both workers from outside
labdist (`client.run`), only for the instrumented passes: labdist carries no profiling code,
so an ordinary run pays nothing. Each round runs every mode twice, plain then instrumented;
the plain passes give the steps/s, the instrumented ones the breakdown (and its overhead).

Rows are exclusive times (a span less the spans it called) in ms per step: the driver's thread
(its remainder is fit's or the loop's own Python), each replica's lane thread (socket, request
unpickling, the hand-offs to and from the step thread) and step thread (compute, collectives
split into publish / wait / receive / reduce / copy-out, optimizer, variables; its remainder
is idle, waiting for the next step). Replica rows are the mean of the 2 replicas. Page faults
are the workers' minor faults per step (fresh pages: allocation); a numpy replica makes no
host syncs.

Run: `python bench/profile_step.py [--steps N] [--rounds R] [--json PATH] [--markdown]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _spans  # bench/ is on sys.path when this runs as a script
from _machine import cpu_account, cpu_seconds, git_revision

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "baselines"))
import cloudpickle  # noqa: E402
import labdist_train  # noqa: E402
from labdist_train import fit_runner, loop_runner  # noqa: E402

# The custom loop's step function travels by value, with its variables, as from a user's script.
cloudpickle.register_pickle_by_value(labdist_train)

BATCH = 64
MODES = ("fit_1", "fit_10", "loop_1")
TITLES = {"fit_1": "fit spe=1", "fit_10": "fit spe=10", "loop_1": "custom loop"}

L, C = "labdist.", "labdist.collectives."
COMPUTE, GLUE, VARS = "compute: forward + backward", "collective: glue", "variables: read / assign"
WORKER_SPANS = [
    (L + "worker.replica:Replica._step", "lane: unpickle request, start step"),
    (L + "worker.loaded:LoadedFunctions.load", "lane: step fn (cache lookup / unpickle)"),
    (L + "worker.lane:recv_message", "lane: socket recv"),
    (L + "worker.lane:send_message", "lane: socket send"),
    (L + "worker.replica:ReplicaCore.to_device", "step: args / results at the boundary"),
    (L + "worker.replica:ReplicaCore.to_host", "step: args / results at the boundary"),
    (L + "training.layers:Dense.forward", COMPUTE),
    (L + "training.layers:Dense.backward", COMPUTE),
    (L + "training.layers:Dense.backward_linear", COMPUTE),
    (L + "training.losses:fused_softmax_grad", COMPUTE),
    (L + "training.losses:Loss.__call__", COMPUTE),
    (L + "training.steps:TrainStep.gradients", "compute: gradient glue (fit)"),
    (L + "training.steps:gradients", "compute: gradient glue (fit)"),
    (L + "training.optimizers:SGD.apply", "optimizer apply"),
    (L + "aggregation:Aggregation.combine", "collective: reduce (sum)"),
    (L + "worker.context:ReplicaContext.reduce_apply", GLUE),
    (L + "worker.context:ReplicaContext.all_reduce", GLUE),
    (L + "worker.context:ReplicaContext.reduce_arrays", GLUE),
    (L + "worker.context:all_reduce", GLUE),
    (C + "algorithms:_reduce_scatter_all_gather", GLUE),
    (C + "algorithms:_segmented", GLUE),
    (C + "algorithms:_gather", "collective: all-gather copy-out"),
    (C + "transports.shm:ShmTransport.exchange", GLUE),
    (C + "transports.shm:ShmTransport._publish", "shm: publish (pickle + copy-in)"),
    (C + "transports.shm:ShmTransport._wait", "shm: wait for the peer's stamp"),
    (C + "transports.shm:ShmTransport._receive", "shm: receive (map + unpickle views)"),
    (L + "variables:Variable.read_value", VARS),
    (L + "variables:Variable.replica_update", VARS),
]
DRIVER_SPANS = [
    (L + "training.model:Sequential.fit", "driver: fit's own loop"),
    (L + "strategies.base:Strategy.run", "driver: run / regroup"),
    (L + "strategies.base:Strategy._select", "driver: run / regroup"),
    (L + "strategies.base:Strategy._regroup", "driver: run / regroup"),
    (L + "strategies.base:Strategy.experimental_local_results", "driver: run / regroup"),
    (L + "input:split_batch", "driver: split the batch"),
    (L + "shipping:dumps", "driver: pickle step fn"),
    (L + "cluster.lane:dumps", "driver: pickle request (args)"),
    (L + "cluster.lane:LaneClient.send", "driver: socket send"),
    (L + "cluster.lane:LaneClient.receive", "driver: recv + unpickle events"),
    (L + "cluster.lane:LaneStepChannel._wait", "driver: waiting for the replicas"),
    (L + "cluster.lane:LaneStepChannel._send", "driver: step channel"),
    (L + "cluster.step_channel:StepChannel.exchange", "driver: step channel"),
]
HANDOFF_IN, HANDOFF_OUT = "lane: hand-off to the step thread", "lane: hand-off back (wake-up)"
STEP_FN = "step: step function's own Python"
WALL = "ms per step (instrumented pass, wall)"
CALLS = "spans timed per step (driver + one replica)"


# -- worker-side hooks (pickled by value; _spans is importable there once bench/ is on path) --
def _hook_start(original):
    def start(self, run_id, fn, args, kwargs, *rest):
        _spans.mark("in")
        return original(self, run_id, _spans.spanned(fn, STEP_FN), args, kwargs, *rest)
    return start


def _hook_start_run(original):
    def start_run(self, run):
        _spans.since("in", HANDOFF_IN)
        return original(self, run)
    return start_run


def _hook_signal(original):
    def signal(self, event, next_event):
        _spans.mark("out")
        return original(self, event, next_event)
    return signal


def _hook_encode(original):
    timed = _spans.spanned(original, "lane: pickle event")

    def encode(event, where):
        _spans.since("out", HANDOFF_OUT)
        return timed(event, where)
    return encode


WORKER_HOOKS = [(L + "worker.replica:ReplicaCore.start", _hook_start),
                (C + "communicator:Communicator.start_run", _hook_start_run),
                (L + "worker.replica:ReplicaCore._signal", _hook_signal),
                (L + "worker.replica:encode", _hook_encode)]


def _add_path(path: str) -> None:
    if path not in sys.path:
        sys.path.insert(0, path)


# -- measuring ---------------------------------------------------------------------------------
def per_step(snapshot: dict, steps: int) -> dict[str, float]:
    """{label: exclusive ms per step}, summed over the threads of one process (labels name
    their thread: "lane", "step", "driver"; compute, collective and variable rows run on the
    step thread)."""
    out: dict[str, float] = {}
    for table in snapshot["threads"].values():
        for label, (exclusive, _inclusive, calls) in table.items():
            out[label] = out.get(label, 0.0) + exclusive / 1e6 / steps
            out[CALLS] = out.get(CALLS, 0.0) + calls / steps
    return out


def instrumented(strategy, run, steps: int) -> tuple[float, dict[str, float], dict[str, Any]]:
    """One pass with spans everywhere: steps/s, the driver's and the replicas' rows."""
    client = strategy.client
    missing = set(_spans.install(DRIVER_SPANS))
    for got in client.run(_spans.install, WORKER_SPANS, WORKER_HOOKS).values():
        missing.update(got)
    try:
        _spans.reset()
        before = client.run(_spans.reset)
        start = time.perf_counter()
        run(steps)
        wall = time.perf_counter() - start
        driver = _spans.snapshot()
        workers = client.run(_spans.snapshot)
    finally:
        _spans.uninstall()
        client.run(_spans.uninstall)
    rows = per_step(driver, steps)
    calls = rows.pop(CALLS, 0.0)
    ms = wall * 1e3 / steps
    rows["driver: own Python (outside the spans)"] = ms - sum(rows.values())
    rows[WALL] = ms
    replicas = [per_step(w, steps) for w in workers.values()]
    rows[CALLS] = calls + sum(rep.pop(CALLS, 0.0) for rep in replicas) / len(replicas)
    for rep in replicas:
        busy = sum(v for k, v in rep.items() if not k.startswith("lane"))
        rep["step: idle or outside the spans"] = ms - busy
    for label in {k for rep in replicas for k in rep}:
        rows[f"replica {label}"] = sum(rep.get(label, 0.0) for rep in replicas) / len(replicas)
    faults = [(workers[w]["faults"]["minflt"] - before[w]["minflt"]) / steps for w in workers]
    return steps / wall, rows, {"missing": sorted(missing), "faults_per_step": faults,
                                "wall_ms_per_step": ms}


def plain(strategy, run, steps: int) -> tuple[float, list[float]]:
    client = strategy.client
    before = client.run(_spans.reset)
    start = time.perf_counter()
    run(steps)
    rate = steps / (time.perf_counter() - start)
    after = client.run(_spans.reset)
    return rate, [(after[w]["minflt"] - before[w]["minflt"]) / steps for w in after]


def profile(steps: int, rounds: int, batch: int = BATCH, log=print) -> dict[str, Any]:
    import numpy as np

    import labdist as ld

    rng = np.random.default_rng(0)
    x = rng.random((batch * steps, 784), dtype=np.float32)
    y = rng.integers(0, 10, batch * steps)
    results: dict[str, Any] = {m: {"plain": [], "instrumented": [], "rows": [], "faults": [],
                                   "notes": []} for m in MODES}
    with ld.MirroredStrategy(num_replicas=2) as strategy:
        strategy.client.run(_add_path, str(HERE))
        runs = {}
        for mode in MODES:
            args = SimpleNamespace(batch=batch, spe=int(mode.split("_")[1]) if "fit" in mode
                                   else 1, steps_per_call=1, update="apply",
                                   input="driver")
            make = fit_runner if mode.startswith("fit") else loop_runner
            runs[mode] = make(strategy, x, y, args)
            runs[mode](20)  # warm-up: the step function reaches the replicas, areas grow
        for r in range(rounds):
            for mode in random.Random(r).sample(MODES, len(MODES)):
                rate, faults = plain(strategy, runs[mode], steps)
                irate, rows, notes = instrumented(strategy, runs[mode], steps)
                res = results[mode]
                res["plain"].append(rate)
                res["instrumented"].append(irate)
                res["rows"].append(rows)
                res["faults"].append(faults)
                res["notes"].append(notes)
                log(f"round {r + 1}: {mode}: {rate:.0f} steps/s plain, {irate:.0f} "
                    "instrumented", file=sys.stderr)
    return results


# -- report ----------------------------------------------------------------------------------
def summarize(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """mode -> label -> median over the rounds of ms per step (plus steps/s and faults)."""
    import statistics

    out: dict[str, dict[str, float]] = {}
    for mode, res in results.items():
        labels = {k for rows in res["rows"] for k in rows}
        table = {k: statistics.median(rows.get(k, 0.0) for rows in res["rows"]) for k in labels}
        table["steps/s (plain)"] = statistics.median(res["plain"])
        table["steps/s (instrumented)"] = statistics.median(res["instrumented"])
        table["page faults per step per replica (plain)"] = statistics.median(
            f for faults in res["faults"] for f in faults)
        out[mode] = table
    return out


def order(labels: set[str]) -> list[str]:
    head = ["steps/s (plain)", "steps/s (instrumented)", WALL]
    tail = ["page faults per step per replica (plain)", CALLS]
    groups = ("driver", "replica lane", "replica step", "replica compute", "replica optimizer",
              "replica collective", "replica shm", "replica variables")
    body = sorted((k for k in labels if k not in head + tail),
                  key=lambda k: (next((i for i, g in enumerate(groups) if k.startswith(g)),
                                      len(groups)), k))
    return head + body + tail


def markdown(summary: dict[str, dict[str, float]]) -> str:
    labels = order({k for table in summary.values() for k in table})
    tail_int = ("page faults per step per replica (plain)", CALLS)
    lines = ["| part (ms per step; replica rows: mean of 2) | "
             + " | ".join(TITLES[m] for m in summary) + " |",
             "|---|" + "---:|" * len(summary)]
    for label in labels:
        cells = []
        for mode in summary:
            v = summary[mode].get(label)
            digits = 0 if label.startswith("steps/s") or label in tail_int else 2
            cells.append("" if v is None else f"{v:.{digits}f}")
        shown = f"**{label}**" if label == WALL else label
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per pass (multiple of 10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH, help="global batch of one step")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    load, before, start = os.getloadavg(), cpu_seconds(), time.perf_counter()
    results = profile(args.steps, args.rounds, args.batch)
    seconds = time.perf_counter() - start
    others = cpu_account(before, seconds)["others_share"]
    summary = summarize(results)
    print(f"labdist {git_revision()}; batch {args.batch}; {args.rounds} rounds of {args.steps} "
          f"steps; load average at start {load[0]:.2f}; other processes {others:.0%} of the CPUs")
    for mode, res in results.items():
        missing = sorted({m for n in res["notes"] for m in n["missing"]})
        if missing:
            print(f"{mode}: not instrumented (not found): {', '.join(missing)}")
    print(markdown(summary))
    if args.json:
        args.json.write_text(json.dumps({"git": git_revision(), "load": load,
                                         "others_share": others, "results": results,
                                         "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
