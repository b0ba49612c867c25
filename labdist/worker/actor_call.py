"""Calling a Dask actor method by (address, key): how the driver reaches parameter servers and
their workers, and how those workers reach the parameter servers. Async, on the caller's event loop,
through a connection pool (`client.rpc` on the driver, `worker.rpc` on a worker)."""

from __future__ import annotations

from typing import Any

from distributed.comm.core import CommClosedError

from labdist.shipping import wire

# what a call raises when the worker at the other end is gone (connection refused or reset)
COMM_ERRORS = (OSError, CommClosedError)


async def call(rpc, address: str, key: str, method: str, *args: Any) -> Any:
    """`method(*args)` on the actor `key` living on the worker at `address`."""
    resp = await rpc(address).actor_execute(actor=key, function=method,
                                            args=[wire(a) for a in args], kwargs={})
    if resp["status"] == "OK":
        return resp["result"]
    raise resp["exception"]
