"""One update a worker pushes to a variable's parameter server, as one typed value from the
worker's context (worker_context.py, fit.py) to the store (store.py, sync.py): the aggregation
travels as the `VariableAggregation` member, never as its name to be parsed back.

Worker-side, so both ends import it without driver code; it pickles (over Dask comms and the
same-host socket, shm_wire.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labdist.enums import VariableAggregation


@dataclass(frozen=True)
class Push:
    """`kind` ("assign", "assign_add", "assign_sub" or "gradient") of `value` to variable
    `var_id`, which a sync step combines with the other workers' by `aggregation`.

    `value` is a host array where the update is made and applied; on its way it may be a
    compressed `Packed` (compressed_push.py) or an `InArea` reference into the worker's
    shared memory (shm_wire.py), which the store turns back into the array.
    """

    var_id: int
    kind: str
    value: Any
    aggregation: VariableAggregation

    def __post_init__(self) -> None:
        if not isinstance(self.aggregation, VariableAggregation):  # a name would be parsed
            raise TypeError(f"Push.aggregation={self.aggregation!r} must be a "
                            "VariableAggregation member")

    def carrying(self, value: Any) -> Push:
        """This update with its value in another form (compressed, placed, decoded)."""
        return Push(self.var_id, self.kind, value, self.aggregation)
