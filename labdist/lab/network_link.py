"""The lab's slowed-down network: the `ld.NetworkModel` a configuration asks for, put on the
workers at a step boundary through the strategy the run steps with (`NetworkModel(...).apply(
strategy)`, `NetworkModel.off(strategy)`), mirrored and parameter-server engines alike. The
model lives in the worker processes, which every strategy of the lab's cluster shares: one
`Link` per run knows what they hold."""

from __future__ import annotations

from typing import Any

from labdist.lab.config import RunConfig
from labdist.network import NetworkModel


class Link:
    """What the lab has put on its cluster's workers (None: nothing, full speed)."""

    def __init__(self) -> None:
        self.applied: NetworkModel | None = None

    def configure(self, config: RunConfig, engine: Any, force: bool = False) -> None:
        """Make the workers' link what `config` asks for, through `engine.strategy` (the
        engine the run steps with now). `force`: put a model on again even if it is there (a
        worker that joined since starts at full speed)."""
        wanted = config.network
        if wanted == self.applied and not (force and wanted is not None):
            return
        if wanted is None:
            NetworkModel.off(engine.strategy)
        else:
            wanted.apply(engine.strategy)
        self.applied = wanted

    def close(self, engine: Any) -> None:
        """Full speed again, as the lab found the workers."""
        if self.applied is not None:
            NetworkModel.off(engine.strategy)
            self.applied = None
