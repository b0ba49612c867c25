"""Calling a Dask actor method by (address, key): how the driver reaches replicas, parameter
servers and their workers, and how those workers reach the parameter servers. Async, on the
caller's event loop, through a connection pool (`client.rpc` on the driver, `worker.rpc` on a
worker)."""

from __future__ import annotations

from typing import Any

from distributed.comm.core import CommClosedError

from labdist.shipping import wire

# what a call raises when the worker at the other end is gone (connection refused or reset)
COMM_ERRORS = (OSError, CommClosedError)


class Unreachable(ConnectionError):
    """The call never reached the actor: its worker is gone, or no longer holds it."""


def unsendable(method: str, where: str, error: BaseException) -> TypeError:
    """The error for arguments of `method` that cannot travel to `where`."""
    return TypeError(f"the arguments of {method!r} cannot be sent to {where}: {error}. Pass "
                     "arrays, numbers, and picklable objects")


async def call(rpc, address: str, key: str, method: str, *args: Any,
               where: str | None = None) -> Any:
    """`method(*args)` on the actor `key` living on the worker at `address`.

    With `where` (how to name the actor in errors), what goes wrong on the way is told apart
    from what the method raised: arguments Dask cannot serialize raise `unsendable`'s
    TypeError, and a worker that cannot be reached (or no longer holds the actor) raises
    `Unreachable`. The method's own exceptions are raised as they are either way.
    """
    try:
        resp = await rpc(address).actor_execute(actor=key, function=method,
                                                args=[wire(a) for a in args], kwargs={})
    except TypeError as e:
        if where is None or "serialize" not in str(e):
            raise
        raise unsendable(method, where, e) from None
    except (*COMM_ERRORS, KeyError) as e:  # KeyError: the worker holds no such actor
        if where is None:
            raise
        raise Unreachable(f"{type(e).__name__}: {e}") from None
    if resp["status"] == "OK":
        return resp["result"]
    raise resp["exception"]
