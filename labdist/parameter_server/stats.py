"""What parameter-server training did, counted where it happens (on each PS) and merged on the
driver: the staleness histogram, torn reads, lost updates, interleaved updates, updates per
worker, dropped stale gradients, the global step and throughput.

Counts are per PS shard: with `num_ps=k`, a step whose variables span every shard is k pushes,
so k updates and k staleness samples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParameterServerStats:
    """`strategy.stats()`: what the parameter servers saw since the strategy started (or since
    `reset_stats()`)."""

    mode: str
    use_locking: bool
    global_step: int
    updates: int  # pushes applied (async) or gradients accepted (sync), summed over PS shards
    updates_per_worker: dict[int, int]
    staleness: dict[int, int]  # staleness -> number of applied gradients
    reads: int  # variable reads by workers
    torn_reads: int  # reads that saw a partially applied update
    interleaved_updates: int  # updates that began while another update of the variable ran
    # updates overwritten by a write that never saw them, wholly or on some chunks: an assign
    # computed from an older read, or (without use_locking) two updates holding one chunk at
    # once (parameter_server/chunked.py). Per worker: whose updates were lost (driver writes: none)
    lost_updates: int
    lost_per_worker: dict[int, int]
    dropped_stale: int  # sync: late (backup) gradients dropped
    dropped_per_worker: dict[int, int]
    elapsed: float  # seconds from the first to the last update
    ssp_waits: int = 0
    ssp_wait_seconds: float = 0.0
    ssp_max_gap: int | None = None  # with staleness_bound: the most functions a worker was ahead
    per_ps: list[dict] = field(default_factory=list, repr=False)

    @property
    def updates_per_second(self) -> float:
        return self.updates / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def max_staleness(self) -> int:
        return max(self.staleness, default=0)

    @property
    def mean_staleness(self) -> float:
        n = sum(self.staleness.values())
        return sum(s * c for s, c in self.staleness.items()) / n if n else 0.0

    @classmethod
    def merge(cls, mode: str, use_locking: bool, global_step: int, shards: list[dict],
              ssp: dict | None) -> ParameterServerStats:
        def add(key: str) -> dict[int, int]:
            total: Counter[int] = Counter()
            for s in shards:
                total.update(s[key])
            return dict(sorted(total.items()))

        firsts = [s["first"] for s in shards if s["first"] is not None]
        lasts = [s["last"] for s in shards if s["last"] is not None]
        return cls(
            mode=mode, use_locking=use_locking, global_step=global_step,
            updates=sum(s["updates"] for s in shards), updates_per_worker=add("per_worker"),
            staleness=add("staleness"), reads=sum(s["reads"] for s in shards),
            torn_reads=sum(s["torn_reads"] for s in shards),
            interleaved_updates=sum(s["interleaved"] for s in shards),
            lost_updates=sum(s["lost_updates"] for s in shards),
            lost_per_worker=add("lost_per_worker"),
            dropped_stale=sum(s["dropped"] for s in shards),
            dropped_per_worker=add("dropped_per_worker"),
            elapsed=(max(lasts) - min(firsts)) if firsts else 0.0,
            ssp_waits=ssp["waits"] if ssp else 0,
            ssp_wait_seconds=ssp["wait_seconds"] if ssp else 0.0,
            ssp_max_gap=ssp["max_gap"] if ssp else None, per_ps=shards)

    def __str__(self) -> str:
        mode = self.mode + (" + use_locking" if self.use_locking else "")
        lines = [
            f"parameter-server stats ({mode}): global step {self.global_step}, "
            f"{self.updates} updates in {self.elapsed:.2f} s ({self.updates_per_second:.1f}/s)",
            f"  updates per worker: {self.updates_per_worker}",
            f"  staleness: {self.staleness} (mean {self.mean_staleness:.2f}, "
            f"max {self.max_staleness})",
            f"  reads: {self.reads}, torn: {self.torn_reads}; lost updates: "
            f"{self.lost_updates} {self.lost_per_worker}; interleaved updates: "
            f"{self.interleaved_updates}",
        ]
        if self.mode == "sync":
            lines.append(f"  dropped stale gradients: {self.dropped_stale} "
                         f"{self.dropped_per_worker}")
        if self.ssp_max_gap is not None:
            lines.append(f"  staleness bound: {self.ssp_waits} waits "
                         f"({self.ssp_wait_seconds:.2f} s), max gap {self.ssp_max_gap}")
        return "\n".join(lines)
