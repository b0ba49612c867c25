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

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        """Before the group of `steps_per_execution` steps that starts at `batch` (of the
        epoch). A callback that overrides a batch hook has `fit` wait for the driver after
        every group (training/trainer/fit_loop.py); without one, the replicas run whole epochs."""

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """After the group that ended with `batch`, with the epoch's running logs (Keras:
        at least once per `steps_per_execution` steps); `model.stop_training = True` here
        ends the epoch after this group."""

    def on_membership_change(self, change) -> None:
        """Quorum training changed the replicas (a `MembershipChange`: lost or joined workers,
        the new `num_replicas`), between two steps of this `fit`."""

    def resume_epoch(self) -> int | None:
        """The epoch `fit` should start at (after `on_train_begin`), or None for no say."""
        return None
