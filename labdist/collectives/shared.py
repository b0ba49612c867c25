"""All-reduce among replicas that share memory (the shm transport: one host).

There a rank's published message is read in place by every peer, so a reduce-scatter needs
no per-peer slicing: each rank publishes its whole arrays once, every rank reduces its own
1/N segment reading all N copies in rank order, publishes that segment, and copies the
others' segments out: two exchanges (two barriers) whatever N is. Each rank reads and sums
about one payload's worth, where the direct algorithm (everyone reduces everything) reads N
of them; on a machine with fewer cores than replicas that N-fold work is what made a 1 MB
all-reduce grow ~N^2 with the replica count. Every segment is still summed once, in rank
order, by one rank, so the copies stay bit-identical.

With more ranks than cores, only as many ranks as there are cores own a segment (`owners`):
the others publish, then sleep until the owners' sums are there. Each owner does more of the
summing, but the group's work is the same, and the ranks that would only have queued for a
core skip one barrier (a wake-up each) and read a few owners' messages instead of every
peer's: at 8 replicas on 2 cores, a third of the time a 1 MB all-reduce took.
"""

from __future__ import annotations

from typing import Any

# From this many bytes a group on shared memory reduce-scatters: below it, one exchange in
# which every rank sums everything is cheaper than a second barrier.
SEGMENT_MIN_BYTES = 64 << 10
# Publishing whole arrays once pays only with 3+ ranks and up to this many bytes: measured
# on 2 cores (bench_core, 2026-11-25), 2 ranks took 25 ms for 16 MiB against 5 ms sending
# each peer its segment, and 3 ranks 97 ms against 70 ms for 64 MB.
SHARED_MAX_BYTES = 16 << 20


def shared_reads(comm: Any, nbytes: int = 0) -> bool:
    """Whether every peer reads this rank's `nbytes` of messages in place (so publish once,
    not per peer). Every rank must answer alike (it picks the message layout), so nothing
    one process alone sets (a per-worker network model) may enter it; a network model
    charges what is published."""
    return (comm.world > 2 and nbytes <= SHARED_MAX_BYTES
            and comm.host.reads_in_place)


def segment_min_bytes(comm: Any, generic: int) -> int:
    """From how many bytes `comm`'s group reduce-scatters rather than reducing directly
    (`generic`: the threshold where messages are copied to each peer)."""
    return SEGMENT_MIN_BYTES if shared_reads(comm) else generic


def owners(comm: Any) -> int:
    """How many ranks (the first ones) own a segment of a reduce-scatter and of the state
    updated by segments (`gather_segments`): every rank, unless peers read in place and the
    group has more ranks than its host's cores (`cores`, agreed at connect, so every rank
    answers alike). It depends on nothing else, so every collective of a group cuts the same
    segments."""
    if not shared_reads(comm):
        return comm.world
    return max(1, min(comm.world, comm.host.cores))
