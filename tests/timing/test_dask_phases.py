"""labdist's phases in Dask's own diagnostics (issue 27, item 4): each replica's reports to the
scheduler carry its phases, which become bars of the scheduler's task stream named
`labdist-wait`, `labdist-comm`, `labdist-compute`, ...: what `distributed.performance_report`
draws and sums, and what the dashboard's Task Stream plots (read here over HTTP with Bokeh's
own client). A real LocalCluster with worker processes."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labdist as ld
from labdist.timing.step_report import phase_bars

STRAGGLE_S = 0.05
RUNS = 10


def straggling_step():
    ctx = ld.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        time.sleep(STRAGGLE_S)
    return ctx.all_reduce("SUM", np.ones(8))


def phase_seconds(records: list[dict], since: float) -> dict[tuple[int, str], float]:
    """(replica, phase) -> seconds of the task stream's labdist phase bars begun after since."""
    out: dict[tuple[int, str], float] = {}
    for r in records:
        if r.get("type") != "labdist phase":
            continue
        (ss,) = r["startstops"]
        if ss["start"] >= since:
            key = (r["replica"], r["phase"])
            out[key] = out.get(key, 0.0) + ss["stop"] - ss["start"]
    return out


@pytest.mark.timeout(180)
def test_phases_in_performance_report_and_dashboard(tmp_path):
    from bokeh.client import pull_session
    from distributed import Client, LocalCluster, performance_report

    report = tmp_path / "report.html"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        strategy = ld.MirroredStrategy(cluster=client)
        try:
            with strategy.scope():
                model = ld.models.Sequential([ld.layers.Dense(4, input_shape=(3,))], seed=0)
                model.compile(loss="mse", optimizer="sgd")
            x = np.random.default_rng(0).normal(size=(128, 3)).astype(np.float32)
            y = np.zeros((128, 4), np.float32)
            with performance_report(filename=str(report)):
                model.fit(x, y, batch_size=16, epochs=2, verbose=0)  # a short mirrored fit
                strategy.run(straggling_step)  # warm: the function shipped and loaded
                time.sleep(0.3)  # apart from what follows: its own busy span
                since = time.time()
                for _ in range(RUNS):
                    strategy.run(straggling_step)
                # reports leave a replica once a second, or once it idled 0.2 s
                deadline, seconds = time.monotonic() + 10, {}
                while time.monotonic() < deadline:
                    seconds = phase_seconds(client.get_task_stream(), since)
                    if (seconds.get((0, "wait"), 0) >= RUNS * 0.045
                            and seconds.get((1, "compute"), 0) >= RUNS * STRAGGLE_S):
                        break
                    time.sleep(0.1)
            # replica 0 waited for the straggler at every all-reduce; replica 1 never did
            assert RUNS * 0.045 <= seconds[(0, "wait")] <= RUNS * 0.08, seconds
            assert seconds.get((1, "wait"), 0.0) < RUNS * 0.01, seconds
            assert seconds[(1, "compute")] >= RUNS * STRAGGLE_S, seconds  # its sleep
            html = report.read_text()
            for name in ("labdist-wait", "labdist-comm", "labdist-compute",
                         "labdist-replica-step"):
                assert name in html, name

            url = client.dashboard_link.replace("/status", "/individual-task-stream")
            with pull_session(url=url) as session:  # the dashboard's own document, over HTTP
                drawn = set()
                for model_ in session.document.models:
                    data = getattr(model_, "data", None)
                    if isinstance(data, dict) and "name" in data and "duration" in data:
                        drawn.update(data["name"])
            assert {"labdist-wait", "labdist-comm", "labdist-compute"} <= drawn, drawn
        finally:
            strategy.close()


def test_phase_bars_lay_each_busy_span_out_by_phase():
    me, other = 7, 8
    spans = [  # a step of 10 s on `me`: 6 s waiting, 1 s moving data, the rest its own work
        ("wait", 2.0, 8.0, me, None), ("comm", 8.0, 9.0, me, None),
        ("step", 0.0, 10.0, me, None), ("wait", 0.0, 5.0, other, None),
        ("step", 20.0, 21.0, me, None),  # a second busy span: compute only
        ("input", 20.0, 20.25, me, None),
    ]
    busy = [[0.0, 10.0, 0, 1, 1], [20.0, 21.0, 1, 1, 0]]
    assert phase_bars(spans, busy, me) == [
        ["compute", 0.0, 3.0], ["wait", 3.0, 9.0], ["comm", 9.0, 10.0],
        ["compute", 20.0, 20.75], ["input", 20.75, 21.0]]


@pytest.mark.timeout(180)
def test_parameter_server_workers_phases_in_the_task_stream():
    """PS workers report to the task stream too: under sync parameter servers with a
    straggler, worker 0's barrier waits are `labdist-wait` bars on its own row, and every
    worker's pulls and pushes are there."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        strategy = ld.ParameterServerStrategy(client, num_workers=2, mode="sync")
        try:
            coordinator = ld.ClusterCoordinator(strategy)
            with strategy.scope():
                v = ld.Variable(np.zeros(4))
            strategy.set_worker_delay(1, STRAGGLE_S)
            since = time.time()
            each = RUNS // 2  # a sync step takes one function from each worker
            for _ in range(RUNS):
                coordinator.schedule(lambda: v.assign_add(np.ones(4)) and None)
            coordinator.join()
            deadline, seconds = time.monotonic() + 10, {}
            while time.monotonic() < deadline:
                seconds = phase_seconds(client.get_task_stream(), since)
                if (seconds.get(("ps-worker-0", "wait"), 0) >= each * 0.6 * STRAGGLE_S
                        and ("ps-worker-1", "push") in seconds
                        and seconds.get(("ps-worker-1", "compute"), 0)
                        >= 0.9 * each * STRAGGLE_S):  # every bar reported (CI saw 4 of 5)
                    break
                time.sleep(0.1)
        finally:
            strategy.close()
    assert seconds.get(("ps-worker-0", "wait"), 0) >= each * 0.6 * STRAGGLE_S, seconds
    assert seconds.get(("ps-worker-1", "wait"), 0) < each * 0.3 * STRAGGLE_S, seconds
    assert seconds[("ps-worker-1", "compute")] >= 0.9 * each * STRAGGLE_S, seconds  # its delay
    for w in ("ps-worker-0", "ps-worker-1"):
        assert (w, "push") in seconds and (w, "compute") in seconds, seconds
