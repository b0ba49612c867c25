"""The replica actor's part in choosing the group's transports (cluster/dask_group.py
asks every replica to probe each candidate, then to connect, then to use the chosen ones),
mixed into `Replica`, whose `core` (its communicator) and `_opened` it uses."""

from __future__ import annotations

import asyncio
from typing import Any


class TransportHooks:
    """Mixed into `Replica`; the driver calls these as actor methods."""

    async def transport_probe(self, name: str) -> Any | None:
        """Open transport `name` here; what peers need to connect to it, or None where this
        replica cannot use it."""
        from labdist.collectives import registry

        transport = registry.create(name, self.core.comm.endpoint)
        probe = transport.probe()
        if probe is None:
            transport.close()
            return None
        previous = self._opened.pop(name, None)
        if previous is not None:
            previous.close()
        self._opened[name] = transport
        return probe

    async def transport_bootstrap(self, name: str, probes: list[Any]) -> Any:
        """On rank 0, for transports that need one rank to set the group up (NCCL's id)."""
        return self._opened[name].bootstrap(probes)

    async def transport_connect(self, name: str, probes: list[Any], *root: Any) -> bool:
        """Whether every peer is reachable over `name`, given every rank's probe (and rank 0's
        bootstrap, if any); a thread: some transports block until every rank has joined."""
        return await asyncio.to_thread(self._opened[name].connect, probes, *root)

    async def transport_use(self, names: list[str]) -> None:
        """Carry collectives over the transports the group chose; close the others opened."""
        opened, self._opened = self._opened, {}
        for name, transport in opened.items():
            if name in names:
                self.core.comm.use(transport)
            else:
                transport.close()
