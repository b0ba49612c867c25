"""labdist's Prometheus metrics on each worker's own `/metrics` route.

Dask's worker serves `prometheus_client`'s global registry there, so a collector registered in
the worker process shows up beside Dask's metrics. It reads, at scrape time only, the totals
the phase recorder keeps (labdist/timing/phases.py) and the counters of any parameter server living
in the process: nothing is added to the hot path.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from labdist.timing import phases

_STORES: weakref.WeakSet = weakref.WeakSet()  # this process's parameter servers
_registered = False
_lock = threading.Lock()
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)  # updates; then +Inf


class LabdistCollector:
    """Steps, seconds per phase, collective bytes, and PS reads, torn reads, updates, lost
    updates and staleness, in Prometheus's naming conventions."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        rec = phases.RECORDER
        yield CounterMetricFamily("labdist_steps", "Training steps taken here: batches a fit "
                                  "loop trained, else a run's steps", value=rec.steps)
        yield CounterMetricFamily("labdist_runs", "Step functions run here (strategy.run, a "
                                  "scheduled function, a fit dispatch)", value=rec.runs)
        hist = HistogramMetricFamily("labdist_phase_seconds",
                                     "Seconds spent per phase of a step", labels=["phase"])
        for name, h in sorted(rec.histogram_copies().items()):
            buckets, running = [], 0
            for bound, n in zip(phases.BUCKETS, h[:-1], strict=True):
                running += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            hist.add_metric([name], buckets, sum_value=h[-1])
        yield hist
        yield CounterMetricFamily("labdist_collective_bytes",
                                  "Array bytes sent to peers in collectives",
                                  value=rec.collective_bytes)
        stores = list(_STORES)
        if not stores:
            return
        for key, text in (("reads", "Variable reads served"),
                          ("torn_reads", "Reads that saw a half-applied update"),
                          ("updates", "Updates applied (async) or accepted (sync)"),
                          ("lost_updates", "Updates overwritten by a concurrent one")):
            total = sum(s.counters.lifetime[key] for s in stores)
            yield CounterMetricFamily(f"labdist_ps_{key}", text, value=total)
        stale = HistogramMetricFamily("labdist_ps_staleness",
                                      "Updates landed between a push's read and its apply")
        counts: dict[int, int] = {}
        for s in stores:
            for k, n in s.counters.lifetime_staleness.items():
                counts[k] = counts.get(k, 0) + n
        buckets = [(str(b), sum(n for k, n in counts.items() if k <= b))
                   for b in STALENESS_BUCKETS]
        buckets.append(("+Inf", sum(counts.values())))
        stale.add_metric([], buckets, sum_value=float(sum(k * n for k, n in counts.items())))
        yield stale


def register(store: Any = None) -> None:
    """Serve labdist's metrics from this process (once; where prometheus_client is missing,
    nothing); `store`: a parameter server whose counters to serve too."""
    global _registered
    if store is not None:
        _STORES.add(store)
    with _lock:
        if _registered:
            return
        try:
            from prometheus_client import REGISTRY
        except ImportError:
            return
        REGISTRY.register(LabdistCollector())
        _registered = True
