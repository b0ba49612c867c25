"""labdist's exceptions. Bad input raises the builtin ValueError/TypeError; these are for the
distributed machinery, so a user can tell a bug in their step function from a lost worker."""

from __future__ import annotations


class LabdistError(Exception):
    """Base class of labdist's own errors."""


class CollectiveMismatchError(LabdistError, RuntimeError):
    """Replicas took different paths: their collectives do not match in kind or order."""


class CollectiveTimeoutError(LabdistError, TimeoutError):
    """A collective waited longer than the strategy's `collective_timeout` for a peer."""


class PeerAbortedError(LabdistError, RuntimeError):
    """This replica stopped because another replica failed first (not the root cause)."""


class ReplicaLostError(LabdistError, RuntimeError):
    """The Dask worker holding a replica went away; its variable copies are gone."""


class ReplicaUnresponsiveError(LabdistError, TimeoutError):
    """A replica did not answer the driver within `collective_timeout` plus a margin after its
    peers had: its worker is frozen (stopped, swapping, stuck in native code) or its step runs
    far longer than theirs. The driver stopped waiting; the worker may still come back."""


class ClusterConnectionError(LabdistError, ConnectionError):
    """The Dask scheduler could not be reached."""


class SaveError(LabdistError, OSError):
    """A model, its weights or a checkpoint could not be written where asked (no permission,
    a file where a folder is needed, a folder where a file is); the message names the path.
    Nothing was left half-written: the files there are the old ones or none."""


class ReplicaDivergenceWarning(UserWarning):
    """An ON_WRITE variable with aggregation NONE now holds different values on its replicas."""


class ParameterServerLostError(ReplicaLostError):
    """The Dask worker holding a parameter server went away, and the variables it held with it:
    training cannot go on; restore the last checkpoint into a new strategy."""

    # set by a PS worker that lost one, so the coordinator can name it and tell a frozen PS
    # from a gone one: which PS (None: not known) and how long it answered nothing (None: it
    # refused or dropped the connection instead)
    ps_index: int | None = None
    silent_s: float | None = None


class OutOfRangeError(LabdistError, IndexError):
    """A scheduled function asked a per-worker iterator for more than its dataset holds."""


class QuorumLostError(ReplicaLostError):
    """Quorum training lost so many replicas that fewer than `min_replicas` are left; the
    survivors' copies are consistent (the unfinished step undone on all of them)."""


class UnreadableAnswerError(LabdistError, TypeError):
    """A replica's answer arrived whole but cannot be unpickled on the driver (a class only
    the worker can rebuild). The replica may still be waiting in merge_call: the run that
    got it releases it, so the next run works."""
