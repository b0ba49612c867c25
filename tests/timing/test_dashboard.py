"""The Dask dashboard shows labdist's work: replicas' steps (which run in actors, so Dask sees
no tasks) reach the scheduler as events, batched once a second per replica, and become
rectangles of the dashboard's Task Stream; and the dashboard link goes through
jupyter-server-proxy under JupyterHub/Binder."""

from __future__ import annotations

import time

import pytest

import labdist as ld
from labdist.timing.dashboard import TASK_PREFIX, proxied_link
from labdist.timing.step_report import TOPIC, StepLog, busy_spans

STEPS = 40


def _task_stream_rows(dask_scheduler) -> dict:
    """On the scheduler: what the dashboard's Task Stream plot would draw (its own component)."""
    from distributed.dashboard.components.scheduler import TaskStream

    stream = TaskStream(dask_scheduler, n_rectangles=10_000)
    stream.update()
    data = stream.source.data
    return {"key": list(data["key"]), "name": list(data["name"]),
            "worker": list(data["worker"]), "duration": list(data["duration"])}


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_replica_steps_appear_in_the_dashboard_task_stream():
    strategy = ld.MirroredStrategy(num_replicas=2)
    try:
        client = strategy.client
        for _ in range(STEPS):
            strategy.run(lambda: ld.get_replica_context().all_reduce("sum", 1.0))
        deadline, steps = time.monotonic() + 10, {}
        while time.monotonic() < deadline:  # reports go out once a second
            steps = {}
            for _when, msg in client.get_events(TOPIC):
                steps[msg["replica"]] = steps.get(msg["replica"], 0) + sum(
                    span[3] for span in msg["spans"])
            if steps == {0: STEPS, 1: STEPS}:
                break
            time.sleep(0.2)
        assert steps == {0: STEPS, 1: STEPS}  # every step, per replica, none twice
        collectives = sum(span[4] for _, msg in client.get_events(TOPIC) for span in msg["spans"])
        assert collectives == 2 * STEPS  # one all-reduce per step on each replica
        events = len(client.get_events(TOPIC))
        assert events <= 2 * 4, events  # batched: not one message per step

        records = [r for r in client.get_task_stream() if r["key"].startswith(TASK_PREFIX)]
        assert {r["replica"] for r in records} == {0, 1}
        assert sum(r["steps"] for r in records) == 2 * STEPS
        assert {r["worker"] for r in records} == set(strategy.workers)

        rows = client.run_on_scheduler(_task_stream_rows)
        ours = [i for i, name in enumerate(rows["name"]) if name == TASK_PREFIX]
        assert len(ours) == len(records)  # drawn, one rectangle per busy span
        assert {rows["worker"][i] for i in ours} == set(strategy.workers)
        assert all(rows["duration"][i] > 0 for i in ours)
    finally:
        strategy.close()


def test_steps_close_together_merge_into_one_span():
    log = StepLog()
    for start in (0.0, 0.01, 0.02, 5.0):
        log.record(start, start + 0.004, 1)
    spans = busy_spans(log.take(), first=10)
    assert spans == [[0.0, 0.024, 10, 3, 3], [5.0, 5.004, 13, 1, 1]]
    assert log.take() == []


@pytest.mark.parametrize(("environ", "installed", "expected"), [
    ({}, True, "http://127.0.0.1:8787/status"),
    ({"JUPYTERHUB_SERVICE_PREFIX": "/user/ada-lab-x1y2/"}, True,
     "/user/ada-lab-x1y2/proxy/8787/status"),
    ({"JUPYTERHUB_SERVICE_PREFIX": "/user/ada/"}, False, "http://127.0.0.1:8787/status"),
])
def test_dashboard_link_goes_through_the_proxy_under_jupyterhub(environ, installed, expected):
    link = proxied_link("http://127.0.0.1:8787/status", environ, proxy_installed=installed)
    assert link == expected


def test_a_dashboard_on_another_host_keeps_its_link():
    link = "http://10.1.2.3:8787/status"
    assert proxied_link(link, {"JUPYTERHUB_SERVICE_PREFIX": "/user/a/"}, True) == link
    assert proxied_link(None, {"JUPYTERHUB_SERVICE_PREFIX": "/user/a/"}, True) is None
