"""One line under each chart saying what it shows and what to expect in the current mode, so
a newcomer can read the panel without the docs. Rewritten on every mode switch."""

from __future__ import annotations

from labdist.lab.config import Kind, RunConfig
from labdist.ui import communication_controls

TORN = ("torn read: a worker read the parameters while an update was half applied (w from "
        "after it, b from before)")
LOST = ("lost update: two updates of one parameter overlapped and the later write erased the "
        "earlier")


def _mirrored_spread(config: RunConfig) -> str:
    sync, agg = config.synchronization.name, config.aggregation.name
    if config.local_steps:
        return (f"DiLoCo H={config.local_steps}: each replica steps alone — spread grows for "
                f"{config.local_steps} steps, then the outer step snaps it to 0")
    if sync == "NONE" or agg == "NONE":
        return f"{sync}, {agg}: replicas update on their own — spread grows"
    if sync == "ON_READ":
        period = config.sync_period
        every = "every step" if period == 1 else f"every {period} steps"
        when = f"drops to 0 {every}" if period else "never re-synced (period 0)"
        return f"ON_READ: each replica updates its own copy — spread grows, {when}"
    return f"ON_WRITE {agg}: every update is applied to each copy — spread stays 0"


def _ps_staleness(config: RunConfig) -> str:
    if config.kind is Kind.PS_SYNC:
        return ("PS sync: the workers' gradients meet at a barrier and make one update — "
                "staleness 0; a late (backup) push is dropped and counted as dropped stale")
    if config.use_locking:
        return ("PS async: updates that landed between a worker's read and its push (a "
                "straggler's pushes land stale); use_locking on: one update at a time, whole "
                "reads — torn reads and lost updates stay 0")
    return ("PS async: updates that landed between a worker's read and its push (a "
            f"straggler's pushes land stale). Without use_locking: {TORN}; {LOST}")


def captions(config: RunConfig) -> dict[str, str]:
    """Caption per chart name (tracked values share the "track" entry)."""
    if not config.kind.is_ps:
        spread = _mirrored_spread(config)
        track = "each replica's copy; " + spread.split(": ", 1)[1].replace(
            "spread grows", "the lines part").replace("spread stays 0", "one line")
        staleness = "mirrored: no parameter servers now (switch the strategy to PS to fill it)"
        throughput = ("steps/s over the last 2 s; every step waits for the slowest replica "
                      "(delays)")
    else:
        mode = config.kind.ps_mode
        spread = (f"PS {mode}: one value on the servers; spread = how far apart the values "
                  "the workers last read are (stale reads), not diverging copies")
        track = f"PS {mode}: the value each worker last read from the parameter servers"
        throughput = ("updates/s over the last 2 s (async: a step is one worker's update); "
                      "each worker loops on its own, so a straggler slows only its own updates"
                      if mode == "async" else
                      "steps/s over the last 2 s; sync: every step waits at the barrier for "
                      "the slowest worker (delays)")
        staleness = _ps_staleness(config)
    state = ("batch norm's moving statistics: each replica updates its own copy from its own "
             "slice (ON_WRITE / NONE), so the lines part; synchronized_bn sums the batch "
             "statistics across replicas — the lines meet" if not config.synchronized_bn else
             "synchronized_bn: every replica takes the global batch's statistics, so the "
             "copies take the same update and the lines meet")
    metric = ("Keras' loss tracker (ON_READ / SUM): inside the step each replica's result() is "
              "its partial; the driver's read sums the copies (black); it restarts each epoch"
              if not config.kind.is_ps else
              "mirrored only: the metric's copies live on the replicas (switch back to fill it)")
    return {"track": track, "state": state, "metric": metric, "spread": spread,
            "loss": "each replica's loss on its own shard, and the global loss (log scale)",
            "throughput": throughput, "staleness": staleness,
            "plane": "each replica's path over the loss surface; circles mark switches",
            "timeline": ("sync: a straggler's peers wait at each all-reduce (orange)"
                         if not config.kind.is_ps else
                         "PS: workers pull, compute and push; nobody waits for a peer"
                         if config.kind.ps_mode == "async" else
                         "PS sync: workers wait at the barrier for the slowest push"),
            **communication_controls.captions(config)}
