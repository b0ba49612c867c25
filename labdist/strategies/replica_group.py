"""The seam between a strategy and its replicas: the `ReplicaGroup` protocol.

A strategy never knows where its replicas run. It holds one group (`strategy.group`) and
replaces it in one method (`Strategy.replace_group`) when the replicas re-form. Three groups
implement the protocol:

- `LocalReplicaGroup` (strategies/one_device.py): one replica in this process;
- `DaskReplicaGroup` (cluster/dask_group.py): one Replica actor per Dask worker, for the
  mirrored strategies;
- `ParameterServerGroup` (parameter_server/actors.py): the parameter servers, each variable
  one copy on one of them; its workers run scheduled functions, not steps.

What a group can do is declared, never probed: `runs_steps`, `remote_input` and `scatter`
returning None are part of the protocol, so a caller reads an attribute instead of asking
`hasattr`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class ReplicaGroup(Protocol):
    """The replicas of one strategy, as the strategy sees them."""

    num_replicas: int
    # Whether its replicas run step functions (`start_step` / `resume`): the local and the
    # Dask group do; parameter servers hold variables while their workers run scheduled
    # functions (their strategy's `run` goes through the coordinator).
    runs_steps: bool
    # Whether input pipelines may move onto the replicas' workers (data/feeds.py).
    remote_input: bool

    # -- variable copies ------------------------------------------------------------------
    def create(self, var_id: int, host: np.ndarray) -> None:
        """Give variable `var_id` a copy of `host` on every replica."""

    def read(self, var_id: int, ranks: Sequence[int]) -> list[np.ndarray]:
        """The copies of `var_id` held by `ranks`, as host arrays."""

    def write(self, var_id: int, mode: str, host: np.ndarray,
              want: Sequence[int]) -> list[np.ndarray]:
        """Apply `mode` ("assign", "assign_add", "assign_sub") of `host` to every copy of
        `var_id`; returns the new copies of the ranks in `want`."""

    def update(self, fn: Callable, args_r: list[tuple], kwargs_r: list[dict]) -> list[Any]:
        """`fn(*args_r[r], **kwargs_r[r])` on each replica r, writes going to its own copies
        (`strategy.extended.update`); each replica's result."""

    # -- steps (where `runs_steps`) -------------------------------------------------------
    def start_step(self, run_id: int, fn: Callable, args_r: list[tuple],
                   kwargs_r: list[dict], steps: int = 1,
                   forget: Sequence[str] = ()) -> list[Any]:
        """Run step `run_id`: `fn` on every replica with its arguments, `steps` times; each
        replica's next StepEvent ("done", "merge" or "error"). `forget`: input pipelines the
        replicas may drop."""

    def resume(self, run_id: int, values: list[Any], errors: list[Any] | None,
               ranks: list[int] | None = None) -> list[Any]:
        """Answer the replicas waiting in merge_call (`ranks`, default all) with their value
        or error; each one's next StepEvent."""

    # -- who the replicas are -------------------------------------------------------------
    def where(self, rank: int) -> str:
        """Replica `rank` in words, for error messages (its worker, its device)."""

    def lost_replicas(self) -> list[int]:
        """The ranks whose worker is gone (left the cluster, as its client or scheduler says)."""

    def present_workers(self) -> list[str]:
        """The workers the cluster has now (a re-formed group may take any of them)."""

    def reform(self, num_replicas: int | None = None) -> ReplicaGroup:
        """A new group on the workers present (`num_replicas` of them, None: all), owning
        what this one owned; this one is closed."""

    def scatter(self, arrays: list[np.ndarray]) -> list[Any] | None:
        """`arrays` copied once to every replica's worker (`fit` on replicas that do not
        share the driver's /dev/shm); None where there is nowhere to copy them to."""

    def close(self) -> None:
        """Let the replicas go, and whatever cluster the group started."""
