"""What every transport implements, and the endpoint it is made for.

A transport is made on each replica, then the replica group agrees on it in two rounds:
`probe` (what peers need to reach this replica, or None where it cannot run here) and
`connect` (given every rank's probe: can this replica reach all of them). Host transports
then carry the collectives' messages (`exchange`); device transports reduce device arrays
whose signatures the host transport already agreed on (`all_reduce`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from labdist.devices import NUMPY, Backend

if TYPE_CHECKING:
    from labdist.aggregation import Aggregation
    from labdist.collectives.mailbox import Mailbox

HOST, DEVICE = "host", "device"  # layers: messages of every collective / device array data


@dataclass
class Endpoint:
    """One replica's place in its group, as transports see it."""

    group: str
    rank: int
    peers: list[str]  # every rank's worker address, in rank order
    timeout: float  # seconds to wait for peers in one collective
    worker: Any = None  # the Dask worker (None in one process)
    mailbox: Mailbox | None = None  # where peers' messages and news of peers arrive
    backend: Backend = NUMPY  # what the replica computes with (its CUDA and NCCL, if any)
    # (message, category) for the driver, raised there when the step returns: the running
    # step's list (the replica context hands it over), so a warning reaches the step it is about
    warnings: list[tuple[str, type]] = field(default_factory=list)

    @property
    def world(self) -> int:
        return len(self.peers)


class Transport(Protocol):
    """Common to both layers. `name` is the `transport=` knob value that requires it;
    `requirement` completes "needs ..." in the error when it cannot be had."""

    name: ClassVar[str]
    layer: ClassVar[str]  # HOST or DEVICE
    requirement: ClassVar[str]
    alone: ClassVar[bool]  # naming it turns the other layers off ("tcp": Dask comms only)
    # rank 0 sets the group up first: `bootstrap(probes)`, called there alone after every
    # probe, returns every rank's second argument to `connect` (NCCL's unique id)
    bootstraps: ClassVar[bool]

    def __init__(self, endpoint: Endpoint) -> None: ...

    def probe(self) -> Any | None:
        """Open this replica's side; what peers need to connect, or None if it cannot run."""

    def connect(self, probes: list[Any]) -> bool:
        """Given every rank's probe (own included): whether every peer is reachable."""

    def close(self) -> None:
        """Release what `probe` and `connect` opened; safe to call more than once."""


class HostTransport(Transport, Protocol):
    """Moves the messages of every collective, in rank order."""

    # when the last peer's message of the latest exchange arrived (time.time()), for the
    # recorded wait (timing/phases.py); None where the transport cannot tell
    last_arrival: float | None
    # peers read a rank's published message in place (one copy for all, not one per peer):
    # the collectives then reduce-scatter across `cores` owners (collectives/shared.py)
    reads_in_place: ClassVar[bool]
    # the fewest cores any rank of the group may run on, agreed at connect (1 where the
    # transport does not ask)
    cores: int

    def start_run(self, run: int) -> None:
        """A step begins: its messages are keyed by `run`."""

    def exchange(self, seq: int, phase: int, sig: Any, payload: Any, what: str,
                 per_peer: bool) -> list[tuple[Any, Any]]:
        """Send (sig, payload) to every peer; return every rank's (sig, payload), own
        included. With `per_peer`, `payload` is indexed by rank: peer d gets `payload[d]`, and
        each peer's reply is what it addressed to this rank."""


class DeviceTransport(Transport, Protocol):
    """Reduces device arrays without a trip through the host."""

    broken: str | None  # why it can no longer be used (travels with each call's signature)

    def start_run(self, run: int) -> None:
        """A step begins (news of peers in the mailbox is keyed by `run`)."""

    def supports(self, backend: Backend, arrays: list[Any], agg: Aggregation) -> bool:
        """Whether it can do this all-reduce as the host path defines it."""

    def all_reduce(self, xp: Any, arrays: list[Any], agg: Aggregation, seq: int, what: str,
                   states: list[str | None]) -> list[Any]:
        """Reduce `arrays` (the same signature on every rank, already checked) as collective
        `seq` (`what`, for errors); `states` is every rank's `broken`."""
