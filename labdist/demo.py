"""`labdist demo`: a short headless experiment on an embedded cluster that shows the core ideas:
the synchronization x aggregation table, and replicas kept identical (MEAN) or left apart
(NONE): with NONE nothing makes the copies agree, so they part at the first step."""

from __future__ import annotations

import time
import warnings

import numpy as np

import labdist as ld


def _divergence_warnings(caught: list) -> list[str]:
    """The messages of the ReplicaDivergenceWarnings labdist raised (shown, never hidden: the
    demo's output and report say when labdist warned)."""
    return [str(w.message) for w in caught
            if issubclass(w.category, ld.ReplicaDivergenceWarning)]


def _table(strategy: ld.Strategy, say) -> list[dict]:
    rows = []
    say("1. assign_add of (replica id + 1) on a variable starting at 10, per replica copy:")
    xs = strategy.experimental_distribute_values_from_function(
        lambda c: float(c.replica_id_in_sync_group + 1))
    for sync in ("ON_WRITE", "ON_READ"):
        for agg in ("NONE", "SUM", "MEAN", "ONLY_FIRST_REPLICA"):
            with strategy.scope():
                v = ld.Variable(10.0, synchronization=sync, aggregation=agg)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ld.ReplicaDivergenceWarning)
                strategy.run(lambda x, v=v: v.assign_add(x), args=(xs,))
            warned = _divergence_warnings(caught)
            local = [float(c) for c in strategy.experimental_local_results(v)]
            try:
                with strategy.scope():
                    read = f"{float(v.read_value()):g}"
            except ValueError:
                read = "ValueError"
            say(f"   {sync:8s} {agg:18s} copies={local}  cross-replica read={read}"
                + ("  (warned: ReplicaDivergenceWarning)" if warned else ""))
            rows.append({"synchronization": sync, "aggregation": agg, "copies": local,
                         "read": read, "warning": warned[0] if warned else None})
    return rows


def _regression(strategy: ld.Strategy, aggregation: str, steps: int, say) -> dict:
    """Fit y = 3x - 2 with SGD; each replica sees a skewed half of every batch. Returns each
    step's copies of w (one per replica) and mean loss, and the final spread of the copies.

    Steps count from 1, as the chart's axis does: step n's w is the copies after the n-th
    update; its loss is measured on step n's batch before that update."""
    rng = np.random.default_rng(0)
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        w = ld.Variable(0.0, aggregation=aggregation, name="w")
        b = ld.Variable(0.0, aggregation=aggregation, name="b")

    def step(x, y):
        err = (w.read_value() * x + b.read_value()) - y
        gw, gb = 2 * (err * x).mean(), 2 * err.mean()
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return float((err ** 2).mean())

    spread = 0.0
    trace: dict = {"aggregation": aggregation, "w": [], "b": [], "loss": [], "warning": None}
    for i in range(steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ld.ReplicaDivergenceWarning)
            # replica r's shard comes from its own region of x (non-identical shards)
            x = np.concatenate([rng.uniform(r, r + 1, 16) for r in range(n)]).astype(np.float32)
            y = (3 * x - 2 + rng.normal(0, 0.1, x.size)).astype(np.float32)
            batch = next(iter(strategy.experimental_distribute_dataset([(x, y)])))
            losses = strategy.run(step, args=batch)  # batch: (x, y) of PerReplica
        warned = _divergence_warnings(caught)
        if warned and trace["warning"] is None:  # labdist warns once per variable
            trace["warning"] = warned[0]
            say(f"   step {i + 1:3d}  labdist warned: ReplicaDivergenceWarning: {warned[0]}")
        ws = [float(c) for c in strategy.experimental_local_results(w)]
        spread = max(ws) - min(ws)
        loss = float(np.mean([float(v) for v in strategy.experimental_local_results(losses)]))
        trace["w"].append(ws)
        trace["b"].append([float(c) for c in strategy.experimental_local_results(b)])
        trace["loss"].append(loss)
        if i % max(1, steps // 5) == 0 or i == steps - 1:
            say(f"   step {i + 1:3d}  loss={loss:8.4f}  w per replica={np.round(ws, 3)}  "
                f"spread={spread:.3g}")
    trace["spread"] = spread
    return trace


def _spread_story(trace: dict) -> str:
    """What the NONE run's spread did, read from its numbers (never assumed)."""
    ws = np.asarray(trace["w"])
    spreads = ws.max(axis=1) - ws.min(axis=1)
    first, last, top = float(spreads[0]), float(spreads[-1]), int(np.argmax(spreads))
    story = f"   spread of w: {first:.3g} after step 1"
    if 0 < top < len(spreads) - 1:
        story += f", {float(spreads[top]):.3g} at its peak (step {top + 1})"
    if last < float(spreads.max()):
        return (story + f", {last:.3g} at the end: both shards come from the same line "
                "y = 3x - 2, so each copy heads for it along its own path; they never agree "
                "as MEAN's do")
    return story + f", {last:.3g} at the end: the copies keep parting"


def run_demo(num_replicas: int = 2, steps: int = 30, say=print) -> dict:
    """Run the demo; returns the figures it printed and what the report draws: the table's
    rows and each experiment's trace."""
    start = time.perf_counter()
    say(f"Starting an embedded Dask cluster with {num_replicas} worker processes ...")
    with ld.MirroredStrategy(num_replicas=num_replicas) as strategy:
        workers = strategy.workers
        say(f"   replicas on workers {workers} "
            f"(dashboard: {strategy.dashboard_link or 'off'})")
        table = _table(strategy, say)
        say("2. SGD with aggregation MEAN (gradients all-reduced on write): copies agree")
        synced = _regression(strategy, "MEAN", steps, say)
        say("3. The same with aggregation NONE: each replica follows only its own shard, so "
            "the copies part at the first step")
        drifted = _regression(strategy, "NONE", steps, say)
        say(_spread_story(drifted))
    seconds = time.perf_counter() - start
    say(f"Done in {seconds:.1f} s.")
    return {"spread_mean": synced["spread"], "spread_none": drifted["spread"],
            "num_replicas": num_replicas, "steps": steps, "workers": workers,
            "seconds": seconds, "table": table, "traces": [synced, drifted]}
