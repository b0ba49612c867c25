"""What the step thread waits on (replica/inbox.py), with real sockets: queued items come
first, the lane's request is announced once it is readable, a merge_call wait takes the
driver's resume from the lane, and a lane that ends is closed (and reported only when the
driver left without a goodbye)."""

from __future__ import annotations

import socket
import threading

import pytest

from labdist.errors import ReplicaLostError
from labdist.replica import lane
from labdist.replica.inbox import LANE, StepInbox, merge_by_lane, serve_lane
from labdist.replica.step_event import ResumeStep


@pytest.fixture
def inbox():
    box = StepInbox()
    driver, replica = socket.socketpair()
    replica.setblocking(False)
    box.attach(replica)
    yield box, driver
    box.close()
    driver.close()


def test_queued_items_come_before_the_lane(inbox):
    box, driver = inbox
    lane.send_message(driver, lane.dumps(("run", 1)))
    box.put(box.jobs, "job")
    assert box.next(box.jobs) == "job"
    assert box.next(box.jobs) is LANE


def test_an_item_put_from_another_thread_wakes_the_wait(inbox):
    box, _ = inbox
    threading.Timer(0.05, box.put, (box.jobs, "late")).start()
    assert box.next(box.jobs) == "late"


def test_a_request_is_answered_on_the_lane(inbox):
    box, driver = inbox
    lane.send_message(driver, b"ping")
    assert box.next(box.jobs) is LANE
    serve_lane(box, lambda raw: raw + b"-pong", dropped=None)
    assert lane.recv_message(driver) == b"ping-pong"


def test_merge_call_takes_the_drivers_resume_from_the_lane(inbox):
    box, driver = inbox
    lane.send_message(driver, lane.dumps(ResumeStep(7.0)))
    assert merge_by_lane(box, b"merge-event", dropped=None) == (7.0, None)
    assert lane.recv_message(driver) == b"merge-event"


def test_merge_call_takes_a_queued_resume_first(inbox):
    box, _ = inbox
    error = ReplicaLostError("the driver is gone")
    box.put(box.resumes, (None, error))  # as `abandon` queues it
    assert merge_by_lane(box, b"merge-event", dropped=None) == (None, error)


@pytest.mark.parametrize("goodbye", [True, False])
def test_a_lane_that_ends_is_closed_and_only_a_vanished_driver_reported(inbox, goodbye):
    box, driver = inbox
    if goodbye:
        lane.send_message(driver, lane.GOODBYE)
    driver.close()
    reported = []
    assert box.next(box.jobs) is LANE
    serve_lane(box, lambda raw: b"", dropped=lambda: reported.append("gone"))
    assert box.lane is None
    assert reported == ([] if goodbye else ["gone"])


def test_a_resume_wait_on_a_vanished_driver_fails_the_step(inbox):
    box, driver = inbox
    driver.close()
    reported = []
    value, error = merge_by_lane(box, b"merge-event", dropped=lambda: reported.append("gone"))
    assert value is None and isinstance(error, ReplicaLostError)
    assert reported == ["gone"] and box.lane is None


def test_detach_closes_the_lane_at_the_next_wait(inbox):
    box, driver = inbox
    box.detach()
    box.put(box.jobs, "after")
    assert box.next(box.jobs) == "after"
    assert box.lane is None
    assert driver.recv(1) == b""  # closed on the replica's side
