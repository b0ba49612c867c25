"""The trace file (issue 27, item 3): `ld.profile(path)` writes a Chrome Trace Event Format
file that validates (complete spans, time-ordered tracks, every process present) and shows a
straggler's peers waiting at the all-reduce; an unwritable path fails before the body runs; a
long run's trace stays bounded. Real worker processes."""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict

import numpy as np
import pytest

import labdist as ld
from labdist.timing import phases

STRAGGLE_S = 0.05


def straggling_step():
    ctx = ld.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        time.sleep(STRAGGLE_S)
    return ctx.all_reduce("SUM", np.ones(32))


def validate(trace: dict) -> list[dict]:
    """What Perfetto and chrome://tracing need: known phases, numbers for times, each track in
    time order, spans nested or apart on a track (never crossing), every flow start with its
    end. Returns the spans."""
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} <= {"M", "X", "s", "f"}
    spans = [e for e in events if e["ph"] == "X"]
    tracks: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] != "M":
            assert isinstance(e["ts"], int | float) and isinstance(e["pid"], int)
            tracks[(e["pid"], e["tid"])].append(e)
    for track in tracks.values():
        stamps = [e["ts"] for e in track]
        assert stamps == sorted(stamps)  # monotonic per track, in file order
        open_ends: list[float] = []
        for e in (e for e in track if e["ph"] == "X"):
            assert e["dur"] >= 0
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 1e-3, e  # nested
            open_ends.append(e["ts"] + e["dur"])
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert starts == {e["id"] for e in events if e["ph"] == "f"}
    return spans


@pytest.mark.timeout(120)
def test_profile_with_no_cluster_named_covers_every_live_strategy(mirrored2, tmp_path):
    """An embedded cluster is not Dask's default client: with none named (and no default),
    `profile` records every live labdist strategy's workers, not the driver alone (issue 38).
    """
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()  # the suite's strategies run embedded clusters: no default
    mirrored2.run(straggling_step)
    path = tmp_path / "trace.json"
    with ld.profile(path):
        time.sleep(0.1)
        for _ in range(3):
            mirrored2.run(straggling_step)
    trace = json.loads(path.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert any("(replica 0)" in n for n in names) and any("(replica 1)" in n for n in names)


@pytest.mark.timeout(120)
def test_trace_of_a_straggling_sync_run(mirrored2, tmp_path):
    mirrored2.run(straggling_step)
    path = tmp_path / "trace.json"
    with ld.profile(path, mirrored2):
        time.sleep(0.1)  # a margin for the clock offsets (~ms): all 10 steps inside
        for _ in range(10):
            mirrored2.run(straggling_step)
    trace = json.loads(path.read_text())
    spans = validate(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    workers = mirrored2.client.scheduler_info()["workers"]
    assert all(any(w in n for n in names) for w in workers), names  # every process present
    replica0 = next(e["pid"] for e in trace["traceEvents"]
                    if e["name"] == "process_name" and "(replica 0)" in e["args"]["name"])
    waits = [e["dur"] / 1e3 for e in spans if e["pid"] == replica0 and e["name"] == "wait"]
    assert len(waits) >= 10 and 45 <= statistics.median(waits) <= 60, waits  # ms
    collectives = [e for e in spans if e["name"] in ("wait", "comm")]
    assert all(e["args"]["bytes"] == 32 * 8 and e["args"]["peers"] == 1 and e["args"]["kind"]
               for e in collectives)
    assert {"step", "compute", "comm", "wait"} <= {e["name"] for e in spans}


def test_unwritable_path_fails_before_the_body(tmp_path):
    ran = []
    for bad in (tmp_path / "missing" / "trace.json", tmp_path):
        with pytest.raises(ValueError, match=r"profile\(path=.*cannot write"), \
                ld.profile(bad):
            ran.append(bad)
    assert ran == []


@pytest.mark.timeout(120)
def test_a_long_run_stays_bounded(mirrored2, tmp_path):
    keep = 40
    client = mirrored2.client
    before = client.run(phases.set_capacity, keep)
    driver_before = phases.set_capacity(keep)  # the driver records too (its `driver` spans)
    try:
        path = tmp_path / "long.json"
        with ld.profile(path, mirrored2):
            for _ in range(60):  # ~4 spans a step on each replica
                mirrored2.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
        spans = validate(json.loads(path.read_text()))
        per_process = defaultdict(int)
        for e in spans:
            if e["name"] != "compute":  # derived from the steps kept
                per_process[e["pid"]] += 1
        assert len(per_process) == 3 and max(per_process.values()) <= keep, per_process
    finally:
        phases.set_capacity(driver_before)
        for address, capacity in before.items():
            client.run(phases.set_capacity, capacity, workers=[address])


@pytest.mark.timeout(120)
def test_strategy_trace_shows_the_driver_beside_the_replicas(mirrored2, tmp_path):
    mirrored2.run(straggling_step)
    path = tmp_path / "strategy.json"
    with mirrored2.trace(path) as written:
        time.sleep(0.05)
        for _ in range(5):
            mirrored2.run(straggling_step)
    assert written == str(path)
    trace = json.loads(path.read_text())
    spans = validate(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    (driver,) = [pid for pid, name in names.items() if name == "driver"]
    mine = [e for e in spans if e["pid"] == driver]
    assert mine and {e["name"] for e in mine} == {"driver"}
    assert sorted(e["args"]["run"] for e in mine if "run" in e["args"]) == sorted(
        {e["args"]["run"] for e in spans if e["name"] == "step"})  # one dispatch a run
    assert len(names) == 3  # the driver and both replicas


def test_strategy_trace_checks_its_path_first(tmp_path):
    strategy = ld.OneDeviceStrategy(device="cpu")
    ran = []
    with pytest.raises(ValueError, match=r"profile\(path=.*cannot write"), \
            strategy.trace(tmp_path / "missing" / "trace.json"):
        ran.append(True)
    assert ran == []
    path = tmp_path / "one.json"
    with strategy.trace(path):  # no cluster: the driver's own process only
        strategy.run(lambda: 1.0)
    validate(json.loads(path.read_text()))


def test_the_encoded_trace_is_what_was_recorded():
    from labdist.timing.trace import encode

    step_args = {"rank": 0, "run": 3}
    push_args = {"worker": 1, "flow": 42}
    processes = [
        {"pid": 11, "name": "tcp://a:1", "threads": {5: 'step "thread" ü'},
         "spans": [("step", 10.0, 10.004, 5, step_args),
                   ("wait", 10.001, 10.002, 5, {"kind": "all_reduce", "bytes": 8}),
                   ("compute", 10.0, 10.001, 5, step_args),
                   ("push", 10.002, 10.003, 5, push_args)]},
        {"pid": 12, "name": "driver", "threads": {},
         "spans": [("apply", 10.0025, 10.0035, 9, {"worker": 1, "flow": 42, "staleness": 0}),
                   ("driver", 9.999, 10.0, 9, None)]},
    ]
    trace = json.loads(encode(processes, origin=10.0))
    spans = validate(trace)
    assert [(e["name"], e["pid"], e["tid"]) for e in spans] == [
        ("step", 11, 5), ("compute", 11, 5), ("wait", 11, 5), ("push", 11, 5),
        ("driver", 12, 9), ("apply", 12, 9)]  # per track, in time order, enclosing first
    step, compute, wait, push, driver, apply = spans
    assert compute["dur"] == 1000.0 and compute["args"] is not None
    assert step["ts"] == 0.0 and step["dur"] == 4000.0 and step["args"] == step_args
    assert wait["ts"] == 1000.0 and wait["args"] == {"kind": "all_reduce", "bytes": 8}
    assert driver["ts"] == -1000.0 and driver["args"] == {}
    names = {(e["name"], e["pid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names[("thread_name", 11)] == {"name": 'step "thread" ü'}
    assert names[("process_name", 11)] == {"name": "tcp://a:1 (replica 0)"}
    (start,) = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    (end,) = [e for e in trace["traceEvents"] if e["ph"] == "f"]
    assert (start["pid"], start["ts"], end["pid"], end["ts"]) == (11, push["ts"], 12, apply["ts"])
    assert trace["otherData"] == {"producer": "labdist", "origin_unix_s": 10.0}


def test_a_process_on_its_own_clock_is_shifted_and_windowed_as_it_is_written():
    """`collect(shifted=False)` leaves a worker's spans on its clock (the trace shifts them as
    it formats them: one pass): the same events as the shifted spans give, and spans begun
    before the window left out."""
    from labdist.timing.trace import encode

    offset = 2.5  # this worker's clock runs 2.5 s ahead of the driver's
    spans = [("step", 10.0, 10.004, 5, {"rank": 0}), ("wait", 10.001, 10.002, 5, None)]
    shifted = {"pid": 11, "name": "w", "threads": {}, "spans": spans, "clock": "driver"}
    own = {"pid": 11, "name": "w", "threads": {}, "offset": offset, "clock": "own",
           "spans": [("step", 9.0 + offset, 9.5 + offset, 5, None)]  # before the window
           + [(n, s + offset, e + offset, t, a) for n, s, e, t, a in spans]}
    assert encode([own], origin=10.0) == encode([shifted], origin=10.0)


def test_worker_formatted_trace_is_the_driver_formatted_one(mirrored2):
    """`profile` has each worker format its own spans (trace.gather): the same text as the
    driver formatting every process's spans (encode of timeline.collect's), replicas' steps,
    collectives and the driver's spans alike."""
    from labdist.timing import timeline, trace

    since = time.time()
    time.sleep(0.05)
    for _ in range(5):
        mirrored2.run(straggling_step)
    client = mirrored2.client
    on_driver = trace.encode(timeline.collect(client, since, shifted=False), since)
    on_workers = trace.gather([client], since)
    assert on_workers == on_driver
    spans = validate(json.loads(on_workers))
    assert {"step", "compute", "wait", "comm", "driver"} <= {e["name"] for e in spans}


@pytest.mark.timeout(180)
def test_worker_formatted_flows_are_the_driver_formatted_ones():
    """Asynchronous parameter servers: pushes on the workers, applies on the parameter
    server, an arrow from each to each; the arrows land at the same places in each track
    when the workers format their spans as when the driver does."""
    from distributed import Client, LocalCluster

    from labdist.timing import timeline, trace

    with LocalCluster(n_workers=3, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        s = ld.ParameterServerStrategy(client, num_ps=1, num_workers=2, mode="async")
        try:
            coordinator = ld.ClusterCoordinator(s)
            with s.scope():
                v = ld.Variable(np.zeros(4))
            since = time.time()
            time.sleep(0.05)
            values = [coordinator.schedule(lambda i: (v.assign_add(np.ones(4)), i)[1],
                                           args=(i,)) for i in range(12)]
            coordinator.join()
            assert [x.fetch() for x in values] == list(range(12))
            on_driver = trace.encode(timeline.collect(client, since, shifted=False), since)
            on_workers = trace.gather([client], since)
        finally:
            s.close()
    assert on_workers == on_driver
    events = json.loads(on_workers)["traceEvents"]
    validate({"traceEvents": events})
    assert sum(e["ph"] == "s" for e in events) >= 12  # an arrow from every push


def test_span_times_are_rounded_to_the_nanosecond_as_round_does():
    """The formatter rounds times with integers (fast) but must give what round(µs, 3)
    gives, ties to even included: random times, and times whose µs end in a half ns."""
    import random

    from labdist.timing.trace_events import fragment

    rng = random.Random(7)
    base = 1.7e9 + rng.random()
    starts = [base + rng.random() * 100 for _ in range(2000)]
    halves = [y for y in (k + 0.0625 * j for k in range(0, 4000, 37) for j in (1, 3, 5, 7, 9))
              if (y / 1e6) * 1e6 == y]  # µs ending in .0625 etc.: ties at the ns
    spans = [("step", s, s + rng.random() * 1e-3, 1, None) for s in starts]
    spans += [("step", y / 1e6, (y + 0.0625 * 3) / 1e6, 2, None) for y in halves]
    got = fragment(spans[:2000], 1, "w", {}, base, True)["pieces"]
    got += fragment(spans[2000:], 1, "w", {}, 0.0, True)["pieces"]
    events = json.loads("[" + ",".join(got) + "]")
    expected = []
    for origin, part in ((base, spans[:2000]), (0.0, spans[2000:])):
        for _, s, e, tid, _ in part:
            ts = round((s - origin) * 1e6, 3)
            expected.append((tid, ts, round(max(round((e - origin) * 1e6, 3) - ts, 0.0), 3)))
    assert len(halves) > 100
    assert sorted((e["tid"], e["ts"], e["dur"]) for e in events) == sorted(expected)
