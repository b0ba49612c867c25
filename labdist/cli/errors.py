"""How the command line tells a user mistake from a bug."""

from __future__ import annotations

import socket
import sys

from labdist.errors import ClusterConnectionError

SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


class UserError(Exception):
    """A mistake the user can fix (bad address, missing package): one line, no traceback."""


def quiet_teardown() -> None:
    """After a user error, objects torn down at exit (a distributed.Client that never
    connected) must not print "Exception ignored in ..." tracebacks over the one-line error."""
    sys.unraisablehook = lambda _unraisable: None


def check_scheduler(address: str | None, timeout: float) -> str:
    """`address` if it looks like a scheduler address and something listens there, else a
    UserError saying what is wrong — before Dask spends its whole timeout retrying."""
    from distributed.comm.addressing import parse_address, parse_host_port

    if not address:
        raise UserError("no scheduler address: pass --scheduler tcp://HOST:8786 (the address "
                        "`dask scheduler` prints) or set LABDIST_SCHEDULER")
    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except ValueError as e:
        raise UserError(f"--scheduler {address!r} is not a scheduler address ({e}); expected "
                        "tcp://HOST:PORT") from None
    if scheme not in SCHEMES:
        raise UserError(f"--scheduler {address!r}: unknown scheme {scheme!r}; allowed: "
                        f"{', '.join(SCHEMES)} (e.g. tcp://HOST:8786)")
    if not 0 < port < 65536:
        raise UserError(f"--scheduler {address!r}: port {port} is outside 1..65535")
    if scheme != "ucx":
        try:
            with socket.create_connection((host, port), timeout=min(timeout, 5.0)):
                pass
        except OSError as e:
            reason = e.strerror or type(e).__name__
            raise UserError(f"no Dask scheduler reachable at {address} ({reason}); start one "
                            "with `dask scheduler`, or check the host and port") from None
    return address


def connection_error(error: ClusterConnectionError) -> UserError:
    return UserError(str(error).split(". Check")[0])
