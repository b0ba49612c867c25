"""The driver's side of parameter servers: `ParameterServerStrategy` (strategy.py), the
`ClusterCoordinator` that schedules functions onto its workers (coordinator.py) and the
`RemoteValue`s it hands out (remote_values.py), the merged `ParameterServerStats`
(stats.py), and `model.fit` on parameter servers (fit.py). What runs on the workers and
the parameter servers themselves is `labdist/worker/ps/`; the actors are placed and called
by `labdist/cluster/ps_group.py`."""

from labdist.parameter_server.coordinator import ClusterCoordinator
from labdist.parameter_server.remote_values import PerWorkerDataset, RemoteValue
from labdist.parameter_server.stats import ParameterServerStats
from labdist.parameter_server.strategy import ParameterServerStrategy

__all__ = [
    "ClusterCoordinator",
    "ParameterServerStats",
    "ParameterServerStrategy",
    "PerWorkerDataset",
    "RemoteValue",
]
