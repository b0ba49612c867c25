"""What a `ParameterServerStrategy` starts its actors with: one typed, frozen value the driver
builds (and validates) and every `ParameterStore` and `ParameterServerWorker` reads by name.

Worker-side, so the actors can import it without any driver code; it travels to them pickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labdist.collectives.compression import Compressor


@dataclass(frozen=True)
class PsSettings:
    """The strategy's knobs as its actors need them (strategy.py validated them).

    mode: "async" or "sync". use_locking: serialise each variable's updates. chunk_size:
    elements per chunk of an update. replicas_to_aggregate: sync mode's pushes per global step
    (None in async mode). staleness_bound: async mode's SSP bound (None: unbounded).
    ps_timeout: seconds a parameter server may answer nothing. transport: "auto" or "tcp".
    compression: the compressor of every worker's pushes (None: plain).
    """

    mode: str
    use_locking: bool
    chunk_size: int
    replicas_to_aggregate: int | None
    staleness_bound: int | None
    ps_timeout: float
    transport: str = "auto"
    compression: Compressor | None = None

    @property
    def sync(self) -> bool:
        """Whether steps are synchronous (SyncReplicas) rather than applied on arrival."""
        return self.mode == "sync"

    @property
    def bounded(self) -> bool:
        """Whether workers wait at a staleness bound (stale synchronous parallel)."""
        return self.staleness_bound is not None
