"""The interactive lab: `ld.Lab` runs one training run in the background and switches its
strategy, synchronization, aggregation and the rest at step boundaries."""

from labdist.lab.config import Kind, RunConfig
from labdist.lab.divergence import DivergenceError
from labdist.lab.history import Event, RunHistory
from labdist.lab.lab import Lab
from labdist.lab.models import BatchNormMLP, DigitsCNN, LabModel, Linear, SoftmaxRegression

__all__ = ["BatchNormMLP", "DigitsCNN", "DivergenceError", "Event", "Kind", "Lab", "LabModel",
           "Linear", "RunConfig", "RunHistory", "SoftmaxRegression"]
