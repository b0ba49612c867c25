"""A replica's part in choosing the group's transports: cluster/dask_group.py asks every
replica to probe each candidate, then to connect, then to use the chosen ones. The `Replica`
actor holds one and answers the driver's calls with it."""

from __future__ import annotations

import asyncio
from typing import Any


class TransportChoice:
    """The transports one replica opened while the group chooses, over its communicator."""

    def __init__(self, comm: Any):
        self.comm = comm
        self._opened: dict[str, Any] = {}  # probed here, until the group chooses

    def probe(self, name: str) -> Any | None:
        """Open transport `name` here; what peers need to connect to it, or None where this
        replica cannot use it."""
        from labdist.collectives import registry

        transport = registry.create(name, self.comm.endpoint)
        probe = transport.probe()
        if probe is None:
            transport.close()
            return None
        previous = self._opened.pop(name, None)
        if previous is not None:
            previous.close()
        self._opened[name] = transport
        return probe

    def bootstrap(self, name: str, probes: list[Any]) -> Any:
        """On rank 0, for transports that need one rank to set the group up (NCCL's id)."""
        return self._opened[name].bootstrap(probes)

    async def connect(self, name: str, probes: list[Any], *root: Any) -> bool:
        """Whether every peer is reachable over `name`, given every rank's probe (and rank 0's
        bootstrap, if any); a thread: some transports block until every rank has joined."""
        return await asyncio.to_thread(self._opened[name].connect, probes, *root)

    def use(self, names: list[str]) -> None:
        """Carry collectives over the transports the group chose; close the others opened."""
        opened, self._opened = self._opened, {}
        for name, transport in opened.items():
            if name in names:
                self.comm.use(transport)
            else:
                transport.close()
