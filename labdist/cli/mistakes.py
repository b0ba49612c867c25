"""How the command line tells a user mistake from a bug."""

from __future__ import annotations

import sys

from labdist.cluster.probe import probe_scheduler
from labdist.errors import ClusterConnectionError

SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


class UserError(Exception):
    """A mistake the user can fix (bad address, missing package): one line, no traceback."""


def quiet_teardown() -> None:
    """After a user error, objects torn down at exit (a distributed.Client that never
    connected) must not print "Exception ignored in ..." tracebacks over the one-line error."""
    sys.unraisablehook = lambda _unraisable: None


def check_scheduler(address: str | None, timeout: float) -> str:
    """`address` if it looks like a scheduler address and a Dask scheduler answers there, else
    a UserError saying what is wrong (and what answered) — before Dask spends its whole
    timeout retrying, or waits for ever on something that is not a scheduler."""
    from distributed.comm.addressing import parse_address, parse_host_port

    if not address:
        raise UserError("no scheduler address: pass --scheduler tcp://HOST:8786 (the address "
                        "`dask scheduler` prints) or set LABDIST_SCHEDULER")
    try:
        scheme, location = parse_address(address)
        _, port = parse_host_port(location)
    except ValueError as e:
        raise UserError(f"--scheduler {address!r} is not a scheduler address ({e}); expected "
                        "tcp://HOST:PORT") from None
    if scheme not in SCHEMES:
        raise UserError(f"--scheduler {address!r}: unknown scheme {scheme!r}; allowed: "
                        f"{', '.join(SCHEMES)} (e.g. tcp://HOST:8786)")
    if not 0 < port < 65536:
        raise UserError(f"--scheduler {address!r}: port {port} is outside 1..65535")
    try:  # an HTTP server, silence, garbage: said in one line within `timeout`
        probe_scheduler(address, timeout)
    except ClusterConnectionError as e:
        raise UserError(str(e)) from None
    return address


def connection_error(error: ClusterConnectionError) -> UserError:
    return UserError(str(error).split(". Check")[0])
