"""Recorded phases as a Chrome Trace Event Format file (opens in Perfetto's UI and in
chrome://tracing): one track per process and thread, a complete ("X") span per phase, the
collectives' kind, bytes and peers as args, and flow arrows from a PS push to its apply.

`profile(path)` checks that it can write `path` before its body runs (an unwritable path
fails before training starts) and writes what every process recorded meanwhile when the body
ends. The recorders are ring buffers, so a long run's trace holds its last spans, bounded.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from labdist import phases
from labdist.cluster import timeline

US = 1e6
_NO_ARGS: dict = {}


def chrome_trace(processes: list[dict[str, Any]], origin: float) -> dict[str, Any]:
    """The trace of `processes` (timeline.collect's), times in µs after `origin`."""
    meta: list[dict] = []
    spans: list[dict] = []
    pushes: dict[int, dict] = {}
    applies: dict[int, list[dict]] = {}
    for index, proc in enumerate(processes):
        pid = int(proc["pid"])
        ranks = sorted({s[4]["rank"] for s in proc["spans"]
                        if s[0] == phases.STEP and s[4] and "rank" in s[4]})
        label = proc["name"] + "".join(f" (replica {r})" for r in ranks)
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                     "args": {"name": label}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                     "args": {"sort_index": index}})
        for tid in sorted({s[3] for s in proc["spans"]}):
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                         "args": {"name": proc["threads"].get(tid, f"thread {tid}")}})
        for name, start, end, tid, args in proc["spans"]:
            event = {"name": name, "cat": "labdist", "ph": "X", "pid": pid, "tid": tid,
                     "ts": (start - origin) * US, "dur": max(end - start, 0.0) * US,
                     "args": args or _NO_ARGS}  # the recorded dict itself: never changed
            spans.append(event)
            if name == "push" or name == "apply":
                flow = event["args"].get("flow")
                if flow is not None and name == "push":
                    pushes[flow] = event
                elif flow is not None:
                    applies.setdefault(flow, []).append(event)
    flows = []
    for flow, targets in applies.items():
        push = pushes.get(flow)
        if push is None:
            continue
        for n, apply in enumerate(targets):
            ident = f"{flow}.{n}"
            flows.append({"ph": "s", "name": "push → apply", "cat": "flow", "id": ident,
                          "pid": push["pid"], "tid": push["tid"], "ts": push["ts"]})
            flows.append({"ph": "f", "bp": "e", "name": "push → apply", "cat": "flow",
                          "id": ident, "pid": apply["pid"], "tid": apply["tid"],
                          "ts": apply["ts"]})
    # per track in time order; an enclosing span before the spans it holds
    events = sorted(spans + flows, key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"producer": "labdist", "origin_unix_s": origin}}


def _client_of(where: Any) -> Any:
    if where is None:
        try:
            from distributed import default_client

            return default_client()
        except ValueError:  # no client: the driver's own spans only
            return None
    client = getattr(where, "client", where)  # a strategy, or a distributed.Client
    # a strategy without a cluster (OneDeviceStrategy): the driver's own spans only
    return client if hasattr(client, "scheduler_info") else None


@contextmanager
def profile(path: str | os.PathLike, client: Any = None) -> Iterator[str]:
    """Record every process's phases while the body runs; write them to `path` as a Chrome
    trace. `client`: a distributed.Client or a strategy (default: Dask's default client)."""
    path = os.fspath(path)
    try:
        with open(path, "w") as f:  # fail here, before any training, if we cannot write
            f.write("")
    except OSError as e:
        raise ValueError(
            f"profile(path={path!r}): cannot write a trace there ({e.strerror}); give a file "
            "path in an existing, writable folder") from None
    client = _client_of(client)
    start = time.time()
    try:
        yield path
    finally:
        write(path, chrome_trace(timeline.collect(client, start), start))


def write(path: str, trace: dict[str, Any]) -> None:
    """The trace as compact JSON in one write: `json.dumps` encodes in C in one pass, where
    `json.dump` to a file goes through Python's encoder piece by piece (several times slower)."""
    text = json.dumps(trace, separators=(",", ":"))
    with open(path, "w") as f:
        f.write(text)
