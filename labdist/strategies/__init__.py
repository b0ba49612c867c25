"""The tf.distribute-shaped strategies (parameter servers: `labdist.parameter_server`)."""

from labdist.quorum.fit import MembershipChange
from labdist.strategies.base import Strategy
from labdist.strategies.extended import StrategyExtended
from labdist.strategies.mirrored import MirroredStrategy
from labdist.strategies.multi_worker import MultiWorkerMirroredStrategy
from labdist.strategies.one_device import OneDeviceStrategy

__all__ = [
    "MembershipChange",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "Strategy",
    "StrategyExtended",
]
