"""A replica's communication modes: local SGD / DiLoCo's settings and the gradient
compressor, set by the strategy between steps (`configure`, run as a step of its own, so a
change always lands at a step boundary), and the counters the strategy reports (`stats`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labdist.replica.replica_context import current


@dataclass(frozen=True)
class LocalSGD:
    """Synchronise every `local_steps` steps: average the replicas' weight change since the
    last synchronisation (the pseudo-gradient) and let `outer_optimizer` apply it (None:
    plain averaging, i.e. outer SGD with learning rate 1)."""

    local_steps: int
    outer_optimizer: Any = None


class Communication:
    """What one replica keeps of its communication modes between steps."""

    def __init__(self, comm):
        self.comm = comm
        self.local_sgd: LocalSGD | None = None
        # the last local-SGD settings: a round still open when local SGD is turned off is
        # closed with them (its outer step), so no inner step is lost
        self.closing: LocalSGD | None = None
        self.inner_steps = 0  # optimizer steps applied locally, not synchronised
        self.outer_steps = 0  # rounds closed (outer optimizer steps)
        self.synced_steps = 0  # steps whose gradients were all-reduced

    def configure(self, compressor, local_sgd: LocalSGD | None,
                  closing: LocalSGD | None = None) -> None:
        """`closing`: the strategy's last local-SGD settings, for a replica of a re-formed
        group (which starts with none) to close a round left open with its outer step."""
        self.comm.compression.set(compressor)
        self.local_sgd = local_sgd
        if local_sgd is not None:
            self.closing = local_sgd
        elif closing is not None:
            self.closing = closing

    def clear(self, whats: tuple[str, ...]) -> None:
        """Start the state of collectives `whats` afresh (the lab's start and reset): no
        error-feedback residuals owed, no PowerSGD warm-start factors. The counters go on."""
        state = self.comm.compression
        state.residuals = {k: v for k, v in state.residuals.items() if k[0] not in whats}
        state.factors = {k: v for k, v in state.factors.items() if k[0] not in whats}

    def owes(self, what: str) -> bool:
        """Whether error-feedback residuals of collective `what` wait to go out."""
        return any(key[0] == what for key in self.comm.compression.residuals)

    def stats(self) -> dict[str, Any]:
        state = self.comm.compression
        return {"bytes_sent": int(self.comm.sent_bytes),
                "compressed_reductions": state.reductions,
                "residual_norm": state.residual_norm(),
                "inner_steps": self.inner_steps, "outer_steps": self.outer_steps,
                "synced_steps": self.synced_steps}


def configure(compressor, local_sgd: LocalSGD | None, closing: LocalSGD | None = None) -> None:
    """On every replica, as a step: switch its communication modes."""
    current().communication.configure(compressor, local_sgd, closing)


def stats() -> dict[str, Any]:
    """On every replica, as a step: its counters (`Communication.stats`)."""
    return current().communication.stats()
