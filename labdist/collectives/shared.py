"""All-reduce among replicas that share memory (the shm transport: one host).

There a rank's published message is read in place by every peer, so a reduce-scatter needs
no per-peer slicing: each rank publishes its whole arrays once, every rank reduces its own
1/N segment reading all N copies in rank order, publishes that segment, and copies the
others' segments out: two exchanges (two barriers) whatever N is. Each rank reads and sums
about one payload's worth, where the direct algorithm (everyone reduces everything) reads N
of them; on a machine with fewer cores than replicas that N-fold work is what made a 1 MB
all-reduce grow ~N^2 with the replica count. Every segment is still summed once, in rank
order, by one rank, so the copies stay bit-identical.
"""

from __future__ import annotations

from typing import Any

from labdist import network

# From this many bytes a group on shared memory reduce-scatters: below it, one exchange in
# which every rank sums everything is cheaper than a second barrier.
SEGMENT_MIN_BYTES = 64 << 10
# Two ranks: the direct algorithm's one barrier wins up to the generic threshold.
PAIR_SEGMENT_MIN_BYTES = 1 << 20


def shared_reads(comm: Any) -> bool:
    """Whether every peer reads this rank's messages in place (so publish once, not per peer).
    Never under a network model: it stands for a real link, where each peer gets its own
    segment, so the algorithms run as they would over one."""
    return network.CURRENT is None and getattr(comm.host, "name", None) == "shm"


def segment_min_bytes(comm: Any, generic: int) -> int:
    """From how many bytes `comm`'s group reduce-scatters rather than reducing directly
    (`generic`: the threshold where messages are copied to each peer)."""
    if not shared_reads(comm):
        return generic
    return PAIR_SEGMENT_MIN_BYTES if comm.world <= 2 else SEGMENT_MIN_BYTES
