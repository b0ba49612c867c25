"""The tf.distribute-shaped strategies."""

from labdist.strategies.base import Strategy
from labdist.strategies.coordinator import ClusterCoordinator
from labdist.strategies.extended import StrategyExtended
from labdist.strategies.mirrored import MirroredStrategy
from labdist.strategies.multi_worker import MultiWorkerMirroredStrategy
from labdist.strategies.one_device import OneDeviceStrategy
from labdist.strategies.parameter_server import ParameterServerStrategy
from labdist.strategies.ps_stats import ParameterServerStats
from labdist.strategies.remote_values import PerWorkerDataset, RemoteValue

__all__ = [
    "ClusterCoordinator",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "ParameterServerStats",
    "ParameterServerStrategy",
    "PerWorkerDataset",
    "RemoteValue",
    "Strategy",
    "StrategyExtended",
]
