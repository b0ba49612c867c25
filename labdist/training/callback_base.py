"""The `Callback` base class (`ld.callbacks.Callback`), in a module of its own so `fit`'s
checks can recognise a callback without importing the callbacks that save checkpoints."""

from __future__ import annotations


class Callback:
    """Base class: override any of the hooks; `self.model` is set by `fit`."""

    model = None

    def set_model(self, model) -> None:
        self.model = model

    def on_train_begin(self, logs=None) -> None:
        pass

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        pass

    def on_train_end(self, logs=None) -> None:
        pass

    def on_membership_change(self, change) -> None:
        """Quorum training changed the replicas (a `MembershipChange`: lost or joined workers,
        the new `num_replicas`), between two steps of this `fit`."""

    def resume_epoch(self) -> int | None:
        """The epoch `fit` should start at (after `on_train_begin`), or None for no say."""
        return None
