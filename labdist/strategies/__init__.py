"""The tf.distribute-shaped strategies (parameter servers: `labdist.parameter_server`)."""

from labdist.strategies.base import Strategy
from labdist.strategies.extended import StrategyExtended
from labdist.strategies.mirrored import MirroredStrategy
from labdist.strategies.multi_worker import MultiWorkerMirroredStrategy
from labdist.strategies.one_device import OneDeviceStrategy

__all__ = [
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "Strategy",
    "StrategyExtended",
]
