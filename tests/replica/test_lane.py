"""The driver's fast lane under hostile and unlucky conditions: local processes that connect to
a replica's lane first and send nothing, a 2^62-byte length or a wrong token; replicas that
stall mid-message or never answer the handshake; lanes that cannot be opened (the strategy
falls back to actor calls); and an IPv6 cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import struct
import threading
import time

import pytest
from distributed import Client, LocalCluster

import labdist as ld
from labdist.cluster import dask_group
from labdist.cluster.lane_channel import LaneClient, connect_lanes
from labdist.replica import lane

PROMPT_S = 20.0  # generous: two cores shared with other test runs


def _promptly(fn, timeout: float = PROMPT_S):
    """fn() on a thread of its own; fails the test (instead of hanging it) if it takes longer
    than `timeout`."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # handed to the test
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still blocked after {timeout:g} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


# -- squatters: local processes that connect to the lane first -------------------------------
def _silent(sock: socket.socket) -> None:
    pass


def _huge_length(sock: socket.socket) -> None:
    sock.sendall(struct.pack("!Q", 2**62))


def _wrong_token(sock: socket.socket) -> None:
    lane.send_message(sock, b"0" * 32)


SQUATTERS = {"silent": _silent, "huge-length": _huge_length, "wrong-token": _wrong_token}


@contextlib.contextmanager
def _squatting(address, how, n: int = 3):
    """`n` connections to `address` that behave as `how` and stay open until the end."""
    socks = []
    try:
        for _ in range(n):
            if isinstance(address, str | bytes):  # a Unix socket's name
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(5)
                sock.connect(address)
            else:
                sock = socket.create_connection(tuple(address), timeout=5)
            socks.append(sock)
            with contextlib.suppress(OSError):
                how(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _answer(raw: bytes) -> bytes:
    """A handler as the Replica's: the answer goes back already pickled."""
    return lane.dumps(("ok", pickle.loads(raw)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", SQUATTERS)
def test_squatters_before_the_driver_do_not_delay_it(how):
    server = lane.LaneServer("127.0.0.1", _answer)
    try:
        with _squatting(server.address, SQUATTERS[how], n=40):
            client = _promptly(lambda: LaneClient(server.address, server.token, timeout=5))
            for i in range(3):
                client.send(lane.dumps(("run", i)))
                assert _promptly(client.receive) == ("ok", ("run", i))
            assert server.serving
            client.close()
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_unauthenticated_connections_are_closed_after_the_handshake_time(monkeypatch):
    monkeypatch.setattr(lane, "HANDSHAKE_TIMEOUT_S", 0.5)
    server = lane.LaneServer("127.0.0.1", _answer)
    try:
        for how in SQUATTERS.values():
            with _squatting(server.address, how, n=1) as (sock,):
                sock.settimeout(10)
                with contextlib.suppress(ConnectionResetError):  # closed with bytes unread
                    assert sock.recv(1) == b""  # closed by the lane, not by us
        assert server.serving
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_the_driver_connection_times_out_on_a_replica_that_never_answers_the_handshake():
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts (backlog), never answers
        start = time.monotonic()
        with pytest.raises(OSError):
            LaneClient(mute.getsockname(), "0" * 32, timeout=1)
        assert connect_lanes([(mute.getsockname(), "0" * 32)], timeout=1) is None
        assert time.monotonic() - start < 10


@pytest.mark.timeout(60)
def test_a_message_that_starts_must_finish(monkeypatch):
    monkeypatch.setattr(lane, "IO_TIMEOUT_S", 0.5)
    stalled = threading.Event()

    def stall(raw: bytes):
        stalled.wait(20)
        return lane.dumps("late")

    server = lane.LaneServer("127.0.0.1", stall)
    try:
        client = LaneClient(server.address, server.token, timeout=5)
        a, b = socket.socketpair()  # a replica that sends a header and then nothing
        with a, b:
            client.sock.close()
            b.setblocking(False)
            client.sock = b
            a.sendall(struct.pack("!Q", 1000) + b"x" * 10)
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                client.receive()
            assert time.monotonic() - start < 10
    finally:
        stalled.set()
        server.close()


@pytest.mark.timeout(60)
def test_a_dropped_driver_is_reported_and_a_goodbye_is_not():
    dropped = []
    server = lane.LaneServer("127.0.0.1", _answer, on_drop=lambda: dropped.append("gone"))
    try:
        client = LaneClient(server.address, server.token, timeout=5)
        client.send(lane.dumps(("run", 1)))
        assert client.receive() == ("ok", ("run", 1))
        client.sock.close()  # as a killed driver's kernel does: no goodbye
        assert _wait(lambda: dropped == ["gone"])
    finally:
        server.close()
    server = lane.LaneServer("127.0.0.1", _answer, on_drop=lambda: dropped.append("again"))
    client = LaneClient(server.address, server.token, timeout=5)
    client.close()  # says goodbye first
    assert _wait(lambda: not server.serving)
    server.close()
    assert dropped == ["gone"]


def _wait(predicate, timeout: float = PROMPT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# -- on a real cluster --------------------------------------------------------------------------
def _lane_threads(client: Client) -> dict[str, int]:
    return client.run(lambda: sum(t.name == "labdist-lane" and t.is_alive()
                                  for t in threading.enumerate()))


def _check_runs(strategy: ld.Strategy, times: int = 3) -> None:
    for i in range(times):
        out = _promptly(lambda i=i: strategy.run(
            lambda: ld.get_replica_context().all_reduce("SUM", float(i))))
        assert strategy.experimental_local_results(out) == (2.0 * i, 2.0 * i)


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", SQUATTERS)
def test_squatters_before_and_during_a_strategy_leave_it_working(external, monkeypatch, how):
    squatters = contextlib.ExitStack()

    def squat_first(ends, timeout):  # between lane_open and the driver's connect
        for address, _, local in ends:
            for where in (address, local) if local else (address,):
                squatters.enter_context(_squatting(where, SQUATTERS[how]))
        return connect_lanes(ends, timeout)

    monkeypatch.setattr(dask_group, "connect_lanes", squat_first)
    with Client(external.address, timeout=20, set_as_default=False) as client, squatters:
        before = _lane_threads(client)
        strategy = _promptly(lambda: ld.MirroredStrategy(cluster=client, connect_timeout=20))
        try:
            assert strategy.group.steps.kind == "lane"
            assert all(lane_client.local for lane_client in strategy.group.steps._lanes)
            _check_runs(strategy)
            for lane_client in strategy.group.steps._lanes:  # more, during its life
                squatters.enter_context(_squatting(lane_client.address, SQUATTERS[how]))
                squatters.enter_context(_squatting(lane_client.sock.getpeername(),
                                                   SQUATTERS[how]))
            _check_runs(strategy)
            assert _lane_threads(client) == {w: n + 1 for w, n in before.items()}
        finally:
            strategy.close()
        assert _wait(lambda: _lane_threads(client) == before)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_lane_that_cannot_be_opened_falls_back_to_actor_calls(external, monkeypatch):
    def broken(ends, timeout):
        raise OSError("no lane today")

    monkeypatch.setattr(dask_group, "connect_lanes", broken)
    with Client(external.address, timeout=20, set_as_default=False) as client:
        before = _lane_threads(client)
        strategy = ld.MirroredStrategy(cluster=client, connect_timeout=20)
        try:
            assert strategy.group.steps.kind == "actor"
            assert _wait(lambda: _lane_threads(client) == before)  # the unused ends closed
            _check_runs(strategy)
        finally:
            strategy.close()
        assert _lane_threads(client) == before


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_an_ipv6_cluster_runs_steps_over_the_lane_and_dask_comms():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            pass
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="[::1]",
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert all(w.startswith("tcp://[::1]:") for w in client.scheduler_info()["workers"])
        strategy = ld.MultiWorkerMirroredStrategy(cluster=client, connect_timeout=20)
        try:
            assert strategy.group.steps.kind == "lane"
            assert all(":" in c.address[0] for c in strategy.group.steps._lanes)
            _check_runs(strategy)
        finally:
            strategy.close()
        strategy = ld.MirroredStrategy(cluster=client, transport="tcp", connect_timeout=20)
        try:  # collectives over Dask comms between IPv6 workers, steps over actor calls
            assert strategy.transport == "tcp" and strategy.group.steps.kind == "actor"
            _check_runs(strategy)
        finally:
            strategy.close()



@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", SQUATTERS)
def test_the_local_socket_asks_for_the_token_too(how):
    server = lane.LaneServer("127.0.0.1", _answer)
    try:
        if server.local_name is None:
            pytest.skip("no abstract Unix sockets here (Linux only)")
        with _squatting(server.local_name, SQUATTERS[how], n=10):
            with pytest.raises(ConnectionRefusedError):  # the Unix socket, a wrong token
                LaneClient(server.address, "0" * 32, timeout=5, local_name=server.local_name)
            client = _promptly(lambda: LaneClient(server.address, server.token, timeout=5,
                                                  local_name=server.local_name))
            assert client.local
            client.send(lane.dumps(("run", 1)))
            assert client.receive() == ("ok", ("run", 1))
            client.close()
    finally:
        server.close()


def _switches() -> dict[str, int]:
    """Voluntary context switches (wake-ups) of the lane's, the step's and the event loop's
    threads of this worker process."""
    out = {}
    for t in threading.enumerate():
        name = "loop" if t is threading.main_thread() else t.name
        if name in ("loop", "labdist-lane") or name.startswith("labdist-replica-"):
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                out[name] = next(int(line.split()[1]) for line in f
                                 if line.startswith("voluntary_ctxt_switches"))
    return out


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_step_over_the_lane_wakes_only_the_step_thread(mirrored2):
    """The step thread reads the lane itself: a run is one wake-up on each replica, not a hop
    from the lane's thread to the step thread and back, nor one through the event loop."""
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/status"):
        pytest.skip("needs Linux's /proc to count a thread's wake-ups")
    strategy, runs = mirrored2, 300
    assert strategy.group.steps.kind == "lane"
    client = strategy.group.client

    def step():
        return 1

    strategy.run(step)
    before = client.run(_switches)
    began = time.perf_counter()
    for _ in range(runs):
        strategy.run(step)
    took = time.perf_counter() - began
    after = client.run(_switches)
    time.sleep(took)  # the event loop's own wake-ups (heartbeats, timers) over as long, idle
    idle = client.run(_switches)
    for worker, old in before.items():
        woke = {name: after[worker][name] - n for name, n in old.items()}
        alone = idle[worker]["loop"] - after[worker]["loop"]
        stepper = next(name for name in woke if name.startswith("labdist-replica-"))
        assert woke[stepper] >= runs // 2, woke  # it sleeps between runs (mostly)
        assert woke["labdist-lane"] <= 5, woke
        # the runs add fewer than one wake-up in two to what the loop does on its own (a
        # busy machine stretches the runs, and the loop's timers fire more in the meantime)
        assert woke["loop"] - alone < runs // 2, (woke, {"loop idle as long": alone})
