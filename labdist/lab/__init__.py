"""The interactive lab: `ld.Lab` runs one training run in the background and switches its
strategy, synchronization, aggregation and the rest at step boundaries (DESIGN.md "The lab")."""

from labdist.lab.config import RunConfig
from labdist.lab.history import Event, History
from labdist.lab.lab import Lab
from labdist.lab.models import LabModel, Linear, SoftmaxRegression

__all__ = ["Event", "History", "Lab", "LabModel", "Linear", "RunConfig", "SoftmaxRegression"]
