"""One line under each chart saying what it shows and what to expect in the current mode, so
a newcomer can read the panel without the docs. Rewritten on every mode switch."""

from __future__ import annotations

from labdist.lab.config import RunConfig

PS_WAIT = ("the lab's PS backend waits for each round, so even async a step waits for its "
           "slowest worker (delays)")


def _mirrored_spread(config: RunConfig) -> str:
    sync, agg = config.synchronization.name, config.aggregation.name
    if sync == "NONE" or agg == "NONE":
        return f"{sync}, {agg}: replicas update on their own — spread grows"
    if sync == "ON_READ":
        period = config.sync_period
        when = f"drops to 0 every {period} steps" if period else "never re-synced (period 0)"
        return f"ON_READ: each replica updates its own copy — spread grows, {when}"
    return f"ON_WRITE {agg}: every update is applied to each copy — spread stays 0"


def captions(config: RunConfig) -> dict[str, str]:
    """Caption per chart name (tracked values share the "track" entry)."""
    if config.kind == "mirrored":
        spread = _mirrored_spread(config)
        track = "each replica's copy; " + spread.split(": ", 1)[1].replace(
            "spread grows", "the lines part").replace("spread stays 0", "one line")
        staleness = "mirrored: no parameter servers now (switch the strategy to PS to fill it)"
        throughput = ("steps/s over the last 2 s; every step waits for the slowest replica "
                      "(delays)")
    else:
        mode = "async" if config.kind == "ps_async" else "sync"
        spread = (f"PS {mode}: one value on the servers; spread = how far apart the values "
                  "the workers last read are (stale reads), not diverging copies")
        track = f"PS {mode}: the value each worker last read from the parameter servers"
        throughput = f"steps/s over the last 2 s; {PS_WAIT}"
        if mode == "async":
            lock = ("use_locking on: pushes are serialised" if config.use_locking else
                    "without use_locking, torn reads and lost updates can be non-zero")
            staleness = (f"PS async: updates applied between a worker's read and its push; "
                         f"{lock}")
        else:
            staleness = ("PS sync: gradients are combined each step — staleness 0; late "
                         "ones are dropped")
    return {"track": track, "spread": spread,
            "loss": "each replica's loss on its own shard, and the global loss (log scale)",
            "throughput": throughput, "staleness": staleness,
            "plane": "each replica's path over the loss surface; circles mark switches"}
