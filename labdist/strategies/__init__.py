"""The tf.distribute-shaped strategies."""

from labdist.strategies.base import Strategy, StrategyExtended
from labdist.strategies.mirrored import MirroredStrategy
from labdist.strategies.one_device import OneDeviceStrategy

__all__ = ["MirroredStrategy", "OneDeviceStrategy", "Strategy", "StrategyExtended"]
