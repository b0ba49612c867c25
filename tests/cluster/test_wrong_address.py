"""An address that is not a Dask scheduler ends within the connect timeout in one clear line
naming the address and what answered: an HTTP server (the dashboard's port, an easy mistake),
a port that accepts and stays silent, one that sends garbage, and a peer that never accepts
(inside a network namespace of this test's own). For the command line (`run`, `info`) and
the strategies alike. Everything here talks to 127.0.0.1 or to that namespace only."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import netns
import pytest

import labdist as ld

TIMEOUT_S = 3.0
SLACK_S = 1.5  # what a loaded 2-core machine may add
CLI_SLACK_S = 4.0  # ... to a command's start-up, which varies more
ROOT = Path(__file__).resolve().parents[2]


# -- things that are not a scheduler ------------------------------------------------------------
class _Quiet(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps the connection open, as the dashboard's server does

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _http(tmp_path: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _raw(talk) -> Iterator[str]:
    """A listener on 127.0.0.1 whose every connection gets `talk(conn, stop)` on a thread."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=talk, args=(conn, stop), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        for conn in conns:
            conn.close()


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()  # accept, then say nothing


def _garbage(conn: socket.socket, stop: threading.Event) -> None:
    with contextlib.suppress(OSError):
        while not stop.is_set():
            conn.sendall(os.urandom(4096))
            time.sleep(0.01)


@contextlib.contextmanager
def _black_hole() -> Iterator[str]:
    """An address inside a namespace of our own that swallows every packet: our end of a veth
    pair sends to a hardware address nobody has, so a connection is never accepted nor
    refused."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    netns.remove_orphans()
    ns, ours = f"{netns.PREFIX}-{os.getpid()}-bh", f"lm{os.getpid():x}b"
    subnet = netns._free_subnet()
    netns._ip("netns", "add", ns)
    try:
        netns._ip("link", "add", ours, "type", "veth", "peer", "name", "eth0", "netns", ns)
        netns._ip("addr", "add", f"{subnet}.1/24", "dev", ours)
        netns._ip("link", "set", ours, "up")
        netns._ip("-n", ns, "link", "set", "eth0", "up")
        netns._ip("neigh", "replace", f"{subnet}.2", "lladdr", "02:00:00:00:00:01", "dev",
                  ours, "nud", "permanent")
        yield f"tcp://{subnet}.2:8786"
    finally:
        netns._delete_namespace(ns)  # our end of the pair goes with it
        netns._ip("link", "del", ours, check=False)


# what each kind is called in the error
KINDS = {
    "http": (lambda tmp: _http(tmp), "an HTTP server answered"),
    "silent": (lambda tmp: _raw(_silent), "said nothing"),
    "garbage": (lambda tmp: _raw(_garbage), "not a Dask handshake"),
    "never-accepts": (lambda tmp: _black_hole(), "nothing accepted a connection"),
}


@pytest.fixture(params=list(KINDS))
def wrong(request, tmp_path) -> Iterator[tuple[str, str]]:
    serve, words = KINDS[request.param]
    with serve(tmp_path) as address:
        yield address, words


# -- the strategies -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [ld.MirroredStrategy, ld.MultiWorkerMirroredStrategy],
                         ids=["mirrored", "multi-worker"])
def test_strategies_say_what_answered_within_the_timeout(wrong, make):
    address, words = wrong
    unraisable: list = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        started = time.monotonic()
        with pytest.raises(ld.ClusterConnectionError) as error:
            make(cluster=address, connect_timeout=TIMEOUT_S)
        took = time.monotonic() - started
        gc.collect()  # a half-made Client would complain in its finalizer here
    finally:
        sys.unraisablehook = hook
    assert took < TIMEOUT_S + SLACK_S, f"took {took:.1f} s with connect_timeout={TIMEOUT_S:g}"
    message = str(error.value)
    assert address in message and words in message, message
    assert "\n" not in message
    assert not unraisable, [str(u.exc_value) for u in unraisable]


# -- the command line ----------------------------------------------------------------------------
def _labdist(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "LABDIST_SCHEDULER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "labdist", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - started


@pytest.fixture
def start_up_s() -> float:
    """What the command takes to fail at once (nothing listens: refused), start-up included:
    measured next to each case, as the machine's load comes and goes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # released: nothing listens there
    done, took = _labdist("info", "--scheduler", f"tcp://127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    return took


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", [["run", "--steps", "5"], ["info"]], ids=["run", "info"])
def test_the_command_line_says_what_answered_in_one_line(wrong, command, start_up_s):
    address, words = wrong
    done, took = _labdist(*command, "--scheduler", address,
                          "--connect-timeout", f"{TIMEOUT_S:g}")
    err = done.stderr.strip()
    assert done.returncode == 1, (done.returncode, done.stdout, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"labdist {command[0]}: error: ") and address in err and words in err
    assert took < start_up_s + TIMEOUT_S + CLI_SLACK_S, (
        f"took {took:.1f} s (start-up {start_up_s:.1f} s, connect timeout {TIMEOUT_S:g} s)")
