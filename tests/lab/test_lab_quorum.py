"""The lab in quorum mode: "kill replica" (a real SIGKILL of a replica's worker process) and
"add replica" mid-run. Counting model: every applied step adds exactly 1 to theta (MEAN of the
replicas' updates), so theta == steps completed means no step was lost or applied twice."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import labdist as ld

pytestmark = pytest.mark.cluster
DATA = (np.zeros((64, 1)), np.zeros(64))


class Counting(ld.lab.LabModel):
    """Gradient -1 on a non-empty shard: with learning rate 1 each applied step adds 1."""

    def init_params(self):
        return {"theta": np.asarray(0.0)}

    def loss_and_grads(self, xp, params, x, y):
        return xp.asarray(0.0), {"theta": xp.asarray(-1.0 if len(x) else 0.0)}


class Slow(Counting):
    """A step long enough for a kill to land inside one."""

    def loss_and_grads(self, xp, params, x, y):
        time.sleep(0.004)
        return super().loss_and_grads(xp, params, x, y)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def workers(lab) -> int:
    return len(lab.strategy.client.scheduler_info(n_workers=-1)["workers"])


def check_counted(lab) -> None:
    """Every copy holds exactly the steps completed; the spread stayed 0 at every step."""
    thetas = [float(v["theta"]) for v in lab.values()]
    assert thetas == [float(lab.step_count)] * len(thetas)
    assert max(lab.history.spread) == 0.0
    counts = sorted(set(int(c) for c in lab.history.contributions))
    assert counts and set(counts) <= {1, 2, 3, 4}


def test_kill_a_replica_mid_run_the_others_go_on():
    with ld.Lab(model=Slow(), data=DATA, num_replicas=2, fault_tolerance="quorum",
                global_batch_size=8, learning_rate=1.0) as lab:
        lab.run(200)
        wait_for(lambda: lab.step_count >= 10, 60, "the run did not start")
        killed_at = lab.step_count  # the step in flight comes after this many
        lab.kill_replica(1)
        lab.wait(timeout=120)
        assert lab.step_count == 200
        lost = [e for e in lab.events if "lost" in e.text]
        assert lost and lost[0].text.startswith("replica 1 lost at step ")
        assert "1 replica goes on" in lost[0].text
        assert lost[0].step >= killed_at
        assert 1 in lab.history.contributions  # steps trained by the survivor alone
        check_counted(lab)


class Broadcasts(logging.Handler):
    """Dask's scheduler's ERROR lines for asks of a worker that failed (printed in red in a
    notebook)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.failed: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "broadcast to" in record.getMessage():
            self.failed.append(record.getMessage())


def test_a_kill_never_fails_the_timelines_poll_of_the_workers():
    """The panel's timeline asks every worker each second; a worker the lab kills is never
    asked again, and a kill waits for a poll in flight, so no ask fails (each would print a
    scheduler ERROR in the notebook) for a kill the user asked for."""
    from labdist.timing import timeline

    failed = Broadcasts()
    logging.getLogger("distributed.scheduler").addHandler(failed)
    polls, errors, stop = [], [], threading.Event()
    try:
        with ld.Lab(model=Slow(), data=DATA, num_replicas=2, fault_tolerance="quorum",
                    global_batch_size=8, learning_rate=1.0) as lab:
            client = lab.strategy.client

            def poll() -> None:
                while not stop.is_set():
                    try:
                        with lab.workers_to_poll() as asked:
                            timeline.collect(client, time.time() - 1.0, rounds=1,
                                             workers=asked)
                        polls.append(asked)
                    except Exception as e:  # the test's finding: any failed poll
                        errors.append(e)

            lab.run(300)
            wait_for(lambda: lab.step_count >= 10, 60, "the run did not start")
            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            wait_for(lambda: len(polls) >= 3, 30, "the poll did not run")
            killed = lab.strategy.replicas[1]["address"]
            lab.kill_replica(1)
            after = len(polls)
            lab.wait(timeout=120)
            wait_for(lambda: workers(lab) == 2, 90, "the nanny did not restart the worker")
            wait_for(lambda: len(polls) >= after + 5, 30, "the poll stopped")
            stop.set()
            poller.join(10)
    finally:
        stop.set()
        logging.getLogger("distributed.scheduler").removeHandler(failed)
    assert errors == [] and failed.failed == []
    assert all(killed not in asked for asked in polls[after:])
    assert killed in polls[0] and len(polls[-1]) == 2  # the replacement is asked


def test_add_replica_grows_within_two_steps_with_identical_copies():
    with ld.Lab(model=Counting(), data=DATA, num_replicas=2, fault_tolerance="quorum",
                global_batch_size=8, learning_rate=1.0) as lab:
        lab.step(5)
        before = workers(lab)
        lab.add_replica()
        wait_for(lambda: workers(lab) > before, 90, "the new worker did not join")
        lab.step(2)
        assert lab.num_replicas == 3
        joined = [e for e in lab.events if "joined" in e.text]
        assert joined and joined[0].text == "replica 2 joined at step 5; 3 replicas"
        check_counted(lab)
        # the parameters are one value, bit for bit, read back from each replica (the loss
        # metric's ON_READ copies are each replica's own partial counts, by design)
        copies = lab.values()
        assert len(copies) == 3
        assert all(np.array_equal(c[k], copies[0][k]) for c in copies for k in c)
        lab.set(delays=[0.0, 0.0, 0.01])  # per-replica settings follow the new count
        lab.step(1)
        check_counted(lab)


def test_the_spread_of_equal_copies_is_exactly_0():
    """Three equal copies: their mean, (0.1 + 0.1 + 0.1) / 3, is not 0.1 in floating point."""
    from labdist.lab.history import spread

    assert spread(np.full((3, 2), 0.1)) == 0.0
    assert spread(np.array([[0.1], [0.1], [0.4]])) > 0.1


def test_bad_replica_calls_change_nothing():
    with pytest.raises(ValueError, match=r"fault_tolerance='always' is not allowed"):
        ld.Lab(fault_tolerance="always")
    with ld.Lab(model=Counting(), data=DATA, num_replicas=2) as lab, \
            pytest.raises(RuntimeError, match="fault_tolerance='quorum'"):
        lab.kill_replica(0)
    with ld.Lab(model=Counting(), data=DATA, num_replicas=2, fault_tolerance="quorum",
                learning_rate=1.0) as lab:
        for rank in (2, -1, "0", True):
            with pytest.raises(ValueError, match=r"rank=.* is not allowed; use an integer in "
                               r"0\.\.1 \(a replica number\)"):
                lab.kill_replica(rank)
        lab.step(2)
        assert lab.num_replicas == 2 and float(lab.values()[1]["theta"]) == 2.0


def test_the_panel_buttons_kill_and_add_and_the_traces_follow():
    """The panel's buttons call the same plain methods; a replica missing from a step is a
    gap (null) in its trace, the spread chart stays at 0, the log says what happened."""
    from labdist.ui import LabPanel

    with ld.Lab(model=Slow(), data=DATA, num_replicas=2, fault_tolerance="quorum",
                global_batch_size=8, learning_rate=1.0, track=["theta"]) as lab:
        panel = LabPanel(lab)
        sent = {name: [] for name in panel.charts}
        for name, chart in panel.charts.items():
            chart.send = (lambda n: lambda msg, buffers=None: sent[n].append(msg))(name)
        assert lab.replica_slots == 4 and panel.replica_buttons is not None
        # the legends and delay sliders show the replicas there are, not the empty slots
        plane = panel.charts["track:theta"]
        assert plane.hidden == ["replica 2", "replica 3"]
        shown = [s.layout.display != "none" for s in panel.controls.delays]
        assert shown == [True, True, False, False]
        lab.run(150)
        wait_for(lambda: lab.step_count >= 10, 60, "the run did not start")
        panel.replica_buttons.rank.value = 1
        panel.replica_buttons.kill.click()
        lab.wait(timeout=120)
        wait_for(lambda: workers(lab) == 2, 90, "the nanny did not restart the killed worker")
        lab.step(2)
        assert lab.num_replicas == 2  # the replacement was taken in
        panel.replica_buttons.add.click()
        wait_for(lambda: workers(lab) == 3, 90, "the new worker did not join")
        lab.step(2)
        assert lab.num_replicas == 3
        deadline = time.monotonic() + 5
        while not panel.publisher.items.empty() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert any("replica 1 lost at step" in line for line in panel.log.lines)
        assert any("joined at step" in line for line in panel.log.lines)
        assert panel.controls.error is None
        appends = [m for m in sent["track:theta"] if m["type"] == "append"]
        xs = [x for m in appends for x in m["x"]]
        assert xs == sorted(set(xs)) and xs[-1] == lab.step_count
        traces = [[v for m in appends for v in m["y"][k]] for k in range(4)]
        assert all(v is not None for v in traces[0])  # replica 0 trained every step
        assert None in traces[1]  # replica 1 was gone for a while (a gap) ...
        assert traces[1][-1] == traces[0][-1] == float(lab.step_count)  # ... and is back
        assert traces[2][-1] == float(lab.step_count)  # the added one
        assert {v for m in sent["spread"] if m["type"] == "append" for v in m["y"][0]} == {0.0}
        # every chart marks who was lost and who joined, where it happened
        marks = [m["label"] for m in sent["spread"] if m["type"] == "event"]
        assert marks[0] == "replica 1 lost" and "replica 2 joined" in marks, marks
        assert plane.hidden == ["replica 3"]  # the added replica is listed, with its slider
        per_replica = {name: chart.hidden for name, chart in panel.charts.items()
                       if "replica 0" in chart.series}
        assert {"loss", "track:theta", "bytes", "residual"} <= per_replica.keys()
        assert all(hidden == ["replica 3"] for hidden in per_replica.values()), per_replica
        assert [s.layout.display != "none" for s in panel.controls.delays] == [True] * 3 + [False]
        panel.close()
