"""The step channel's gather/notice/tell logic over both transports, against fake replicas (no
Dask): actor calls on an event loop of our own, and real lanes on localhost."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from labdist.cluster import step_channel
from labdist.cluster.lane_channel import LaneClient, LaneStepChannel
from labdist.cluster.step_channel import ActorStepChannel
from labdist.errors import ReplicaLostError, ReplicaUnresponsiveError
from labdist.replica.lane import LaneServer, dumps
from labdist.replica.step_event import ResumeStep, RunStep, StepEvent


class FakeReplicas:
    """Replicas whose step requests are answered by `answers[rank](request)`, called on a
    thread of their own (as a replica's step thread would compute)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answers):
        self.loop = loop
        self.answers = answers
        self.told: list[tuple] = []
        self.told_event = threading.Event()
        self.gone: set[int] = set()
        self.cancelled: set[int] = set()

    def lost(self, rank: int) -> bool:
        return rank in self.gone

    def lost_error(self, rank: int, detail: str) -> ReplicaLostError:
        return ReplicaLostError(f"{self.where(rank)} was lost ({detail})")

    def where(self, rank: int) -> str:
        return f"replica {rank}"

    async def call(self, rank: int, method: str, *args):
        if method == "peer_state":
            self.told.append((rank, *args))
            self.told_event.set()
            return None
        try:
            assert method == "step"
            return await asyncio.to_thread(self.answers[rank], *args)
        except asyncio.CancelledError:
            self.cancelled.add(rank)
            raise


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture
def release():
    """Set at the end of each test: frees answers still blocked on it."""
    event = threading.Event()
    yield event
    event.set()


def make_channel(transport: str, replicas: FakeReplicas, collective_timeout=None):
    if transport == "actor":
        return ActorStepChannel(replicas, collective_timeout)
    servers = [LaneServer("127.0.0.1",
                          lambda raw, r=r: dumps(replicas.answers[r](pickle.loads(raw))))
               for r in range(len(replicas.answers))]
    lanes = [LaneClient(s.address, s.token, timeout=5) for s in servers]
    channel = LaneStepChannel(replicas, lanes, collective_timeout)
    channel.servers = servers
    return channel


def close_channel(channel) -> None:
    channel.close()
    for server in getattr(channel, "servers", []):
        server.close()


TRANSPORTS = ["actor", "lane"]


def runs(run_id: int, args_per_rank: list[tuple]) -> list[RunStep]:
    """A step request for each rank, with its arguments (no step function: fakes answer)."""
    return [RunStep(run_id, (), args, {}) for args in args_per_rank]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_prompt_answers_come_back_in_rank_order_and_nobody_is_told(loop, transport):
    replicas = FakeReplicas(loop, [lambda req, r=r: StepEvent("done", 0, value=(r, req))
                                   for r in range(3)])
    channel = make_channel(transport, replicas)
    try:
        events = channel.step(7, runs(7, [(r,) for r in range(3)]), [0, 1, 2])
        assert [e.value for e in events] == [(r, RunStep(7, (), (r,), {})) for r in range(3)]
        events = channel.step(7, [ResumeStep("a"), ResumeStep("c")], [0, 2])
        assert [e.value for e in events] == [(0, ResumeStep("a")), (2, ResumeStep("c"))]
        assert replicas.told == []
    finally:
        close_channel(channel)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_replica_still_running_is_told_how_its_peer_left(loop, release, transport):
    """Rank 1 waits for a collective rank 0 never makes: told that rank 0 finished (after
    NOTICE_AFTER_S), it fails at once instead of at its collective timeout."""
    def waits_for_peer(request):
        told = replicas.told_event.wait(10)
        return StepEvent("error", 0, error=RuntimeError(f"told={told}"))

    replicas = FakeReplicas(loop, [lambda req: StepEvent("done", 2), waits_for_peer])
    channel = make_channel(transport, replicas)
    try:
        start = time.monotonic()
        events = channel.step(5, runs(5, [(), ()]), [0, 1])
        took = time.monotonic() - start
        assert [e.kind for e in events] == ["done", "error"]
        assert str(events[1].error) == "told=True"
        assert replicas.told == [(1, 5, 0, "done", 2)]
        assert step_channel.NOTICE_AFTER_S <= took < 5
    finally:
        close_channel(channel)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failed_peer_is_told_with_its_error(loop, transport):
    def fails(request):
        return StepEvent("error", 1, error=KeyError("boom"))

    def waits_for_peer(request):
        replicas.told_event.wait(10)
        return StepEvent("done", 1)

    replicas = FakeReplicas(loop, [waits_for_peer, fails])
    channel = make_channel(transport, replicas)
    try:
        events = channel.step(9, runs(9, [(), ()]), [0, 1])
        assert [e.kind for e in events] == ["done", "error"]
        assert replicas.told == [(0, 9, 1, "failed", "KeyError: 'boom'")]
    finally:
        close_channel(channel)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_lost_worker_is_not_waited_for(loop, release, transport):
    def never(request):
        release.wait(30)
        return StepEvent("done", 0)

    replicas = FakeReplicas(loop, [lambda req: StepEvent("done", 0), never])
    channel = make_channel(transport, replicas)
    try:
        threading.Timer(0.3, replicas.gone.add, (1,)).start()
        start = time.monotonic()
        events = channel.step(1, runs(1, [(), ()]), [0, 1])
        assert time.monotonic() - start < 5
        assert events[0].kind == "done"
        assert events[1].kind == "error" and isinstance(events[1].error, ReplicaLostError)
        assert "replica 1 was lost (its worker left the cluster)" in str(events[1].error)
        if transport == "actor":  # the call to the lost replica was given up, not left behind
            deadline = time.monotonic() + 5
            while 1 not in replicas.cancelled and time.monotonic() < deadline:
                time.sleep(0.01)
            assert replicas.cancelled == {1}
    finally:
        release.set()
        close_channel(channel)


def test_arguments_the_lane_cannot_carry_name_the_method_and_replica(loop):
    sent = []
    replicas = FakeReplicas(loop, [lambda req: sent.append(req) or StepEvent("done", 0)] * 2)
    channel = make_channel("lane", replicas)
    try:
        with pytest.raises(TypeError, match=r"arguments of 'run' cannot be sent to replica 1"):
            channel.step(1, runs(1, [(1,), (threading.Lock(),)]), [0, 1])
        assert sent == []  # nothing went out: the replicas are free for the next step
        assert [e.kind for e in channel.step(2, runs(2, [(1,), (2,)]), [0, 1])] == ["done"] * 2
    finally:
        close_channel(channel)


def test_a_closed_lane_is_a_lost_replica(loop):
    replicas = FakeReplicas(loop, [lambda req: StepEvent("done", 0)] * 2)
    channel = make_channel("lane", replicas)
    try:
        channel._lanes[1].close()
        events = channel.step(1, runs(1, [(), ()]), [0, 1])
        assert events[0].kind == "done"
        assert isinstance(events[1].error, ReplicaLostError)
    finally:
        close_channel(channel)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_late_answer_is_never_taken_for_a_later_exchanges(loop, release, transport,
                                                            monkeypatch):
    """Rank 1 is still silent `patience` after rank 0 answered: an error event names it. Its
    answer, owed, is collected before anything else goes to it: while it stays silent the next
    exchange raises (nothing sent), and once it comes the one after gets its own answers."""
    monkeypatch.setattr(step_channel, "LATE_MARGIN_S", 0.3)
    first = threading.Event()

    def slow_first(request):
        if not first.is_set():
            first.set()
            release.wait(20)
            return StepEvent("done", 0, value="old")
        return StepEvent("done", 0, value=request)

    replicas = FakeReplicas(loop, [lambda req: StepEvent("done", 0, value=req), slow_first])
    channel = make_channel(transport, replicas, collective_timeout=0.2)
    try:
        events = channel.step(1, runs(1, [(1,), (1,)]), [0, 1])
        assert events[0].value == RunStep(1, (), (1,), {})
        assert isinstance(events[1].error, ReplicaUnresponsiveError)
        assert "replica 1 did not answer" in str(events[1].error)
        with pytest.raises(ReplicaUnresponsiveError, match="replica 1 has not answered"):
            channel.step(2, runs(2, [(2,), (2,)]), [0, 1])
        release.set()
        events = channel.step(3, runs(3, [(3,), (3,)]), [0, 1])
        assert [e.value for e in events] == [RunStep(3, (), (3,), {})] * 2
        assert (1, 1, 0, "failed", step_channel._ENDED_EARLY) in replicas.told
    finally:
        release.set()
        close_channel(channel)

