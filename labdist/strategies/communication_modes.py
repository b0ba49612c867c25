"""Less communication, as modes a mirrored strategy switches between steps: compressed
gradient all-reduces (`compression=`) and local SGD / DiLoCo (`local_steps=`,
`outer_optimizer=`). The strategy only checks and forwards the settings; the replicas keep
them (replica/communication_state.py) and the training step acts on them
(training/trainer/diloco.py)."""

from __future__ import annotations

from typing import Any

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


class CommunicationModes:
    """Mixed into MirroredStrategy: the knobs, their setters and the counters."""

    _compressor: compressors.Compressor | None = None
    _local_sgd: LocalSGD | None = None
    # the last local-SGD settings in force: a re-formed group gets them, so a round left open
    # when local SGD was turned off still closes with its outer step (not plain averaging)
    _closing: LocalSGD | None = None

    def _init_communication(self, compression: Any, local_steps: Any,
                            outer_optimizer: Any) -> tuple:
        """Check the constructor's knobs (before anything starts)."""
        return compressors.parse(compression), check_local_sgd(local_steps, outer_optimizer)

    def _send_communication(self) -> None:
        """To every replica (new ones after a re-forming): the modes in force and the last
        local-SGD settings, which close a round still open."""
        if self._local_sgd is not None:
            self._closing = self._local_sgd
        if self._compressor is not None or self._closing is not None:
            self.run(replica_side.configure,
                     args=(self._compressor, self._local_sgd, self._closing))

    @property
    def compression(self) -> compressors.Compressor | None:
        """The gradient all-reduce's compressor (None: plain). Settable between steps:
        'none', 'fp16', 'bf16', or `ld.compression.TopK(ratio)` / `PowerSGD(rank)` / ...;
        error-feedback residuals carry over a change, so no gradient is lost."""
        return self._compressor

    @compression.setter
    def compression(self, value: Any) -> None:
        compressor = compressors.parse(value)
        self.run(replica_side.configure, args=(compressor, self._local_sgd, self._closing))
        self._compressor = compressor

    @property
    def local_steps(self) -> int | None:
        """Steps each replica takes on its own between synchronisations (None: every step)."""
        return None if self._local_sgd is None else self._local_sgd.local_steps

    @property
    def outer_optimizer(self) -> Any:
        """The optimizer applying the averaged pseudo-gradient (None: plain averaging)."""
        return None if self._local_sgd is None else self._local_sgd.outer_optimizer

    def set_local_sgd(self, local_steps: int | None, outer_optimizer: Any = None) -> None:
        """Switch local SGD / DiLoCo on (`local_steps=H`), change it, or off (None), at the
        next step boundary. Turning it off closes a round in progress with its outer step
        first; a new H applies to the round in progress (it closes once H steps are done)."""
        settings = check_local_sgd(local_steps, outer_optimizer)
        self.run(replica_side.configure, args=(self._compressor, settings, self._closing))
        self._local_sgd = settings
        if settings is not None:
            self._closing = settings

    def communication_stats(self) -> list[dict[str, Any]]:
        """Per replica: `bytes_sent` (array bytes sent to peers by every collective so far),
        `compressed_reductions`, `residual_norm` (error feedback's), `inner_steps`,
        `outer_steps` and `synced_steps` (updates applied locally, rounds closed, steps
        all-reduced)."""
        per_replica = self.experimental_local_results(self.run(replica_side.stats))
        return [{k: getattr(v, "item", lambda v=v: v)() for k, v in d.items()}
                for d in per_replica]
