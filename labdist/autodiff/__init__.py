"""Gradients of eager array code: `GradientTape` records, `Recorded` values carry the record.

Arrays only, no strategies: a variable takes part through the `Watchable` seam, so the
variables module (above this package) hands its reads to `tape.read`.
"""

from labdist.autodiff.recorded import Recorded, node, unwrap
from labdist.autodiff.sliced import SlicedGradient, squares_of
from labdist.autodiff.tape import GradientTape, Watchable, read, recording

__all__ = ["GradientTape", "Recorded", "SlicedGradient", "Watchable", "node", "read",
           "recording", "squares_of", "unwrap"]
