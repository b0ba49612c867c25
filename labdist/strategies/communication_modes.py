"""Less communication, as modes a mirrored strategy switches between steps: compressed
gradient all-reduces (`compression=`) and local SGD / DiLoCo (`local_steps=`,
`outer_optimizer=`). The strategy only checks and forwards the settings; the replicas keep
them (replica/communication_state.py) and the training step acts on them
(training/trainer/diloco.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from labdist import checks
from labdist.collectives import compression as compressors
from labdist.replica import communication_state as replica_side
from labdist.replica.communication_state import LocalSGD


def check_local_sgd(local_steps: Any, outer_optimizer: Any) -> LocalSGD | None:
    """The settings for `local_steps` (None: synchronise every step) and `outer_optimizer`."""
    steps = checks.integer("local_steps", local_steps, 1, optional=True)
    if outer_optimizer is not None and not (callable(getattr(outer_optimizer, "apply", None))
                                            and callable(getattr(outer_optimizer, "slots",
                                                                 None))):
        checks.refuse("outer_optimizer", outer_optimizer,
                      "None or an optimizer (e.g. ld.optimizers.SGD(0.7, momentum=0.9, "
                      "nesterov=True))", TypeError)
    if steps is None:
        if outer_optimizer is not None:
            raise ValueError(f"outer_optimizer={outer_optimizer!r} needs local_steps: the outer "
                             "optimizer applies the replicas' averaged weight change every "
                             "local_steps steps; pass local_steps=H (an integer >= 1)")
        return None
    return LocalSGD(steps, outer_optimizer)


def parse_modes(compression: Any, local_steps: Any, outer_optimizer: Any
                ) -> tuple[compressors.Compressor | None, LocalSGD | None]:
    """The constructor's knobs, checked before anything starts: (compressor, local SGD)."""
    return compressors.parse(compression), check_local_sgd(local_steps, outer_optimizer)


class CommunicationModes:
    """A mirrored strategy's communication modes, the component it holds: the knobs in force,
    their setters and the counters, sent to the replicas through the strategy's `run`."""

    def __init__(self, run: Callable[..., Any], local_results: Callable[[Any], tuple],
                 modes: tuple[compressors.Compressor | None, LocalSGD | None]):
        self._run, self._local_results = run, local_results
        self.compressor, self.local_sgd = modes
        # the last local-SGD settings in force: a re-formed group gets them, so a round left
        # open when local SGD was turned off still closes with its outer step (not plain
        # averaging)
        self._closing: LocalSGD | None = None

    def send(self) -> None:
        """To every replica (new ones after a re-forming): the modes in force and the last
        local-SGD settings, which close a round still open."""
        if self.local_sgd is not None:
            self._closing = self.local_sgd
        if self.compressor is not None or self._closing is not None:
            self._run(replica_side.configure,
                      args=(self.compressor, self.local_sgd, self._closing))

    def set_compression(self, value: Any) -> None:
        compressor = compressors.parse(value)
        self._run(replica_side.configure, args=(compressor, self.local_sgd, self._closing))
        self.compressor = compressor

    def set_local_sgd(self, local_steps: int | None, outer_optimizer: Any = None) -> None:
        settings = check_local_sgd(local_steps, outer_optimizer)
        self._run(replica_side.configure, args=(self.compressor, settings, self._closing))
        self.local_sgd = settings
        if settings is not None:
            self._closing = settings

    def stats(self) -> list[dict[str, Any]]:
        per_replica = self._local_results(self._run(replica_side.stats))
        return [{k: _python(v) for k, v in d.items()} for d in per_replica]


def _python(value: Any) -> Any:
    """A counter as a Python number (numpy scalars come back from the replicas)."""
    return value.item() if isinstance(value, np.generic | np.ndarray) else value
