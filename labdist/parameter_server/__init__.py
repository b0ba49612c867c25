"""Parameter-server training (SEMANTICS.md §5): ParameterServerStrategy, ClusterCoordinator,
and what they count (stats)."""

from labdist.parameter_server.coordinator import ClusterCoordinator, PerWorkerDataset, RemoteValue
from labdist.parameter_server.stats import ParameterServerStats
from labdist.parameter_server.strategy import ParameterServerStrategy
from labdist.parameter_server.worker import InputContext

__all__ = [
    "ClusterCoordinator",
    "InputContext",
    "ParameterServerStats",
    "ParameterServerStrategy",
    "PerWorkerDataset",
    "RemoteValue",
]
