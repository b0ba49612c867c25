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
    """The trace of `processes` (timeline.collect's), times in µs after `origin`, as a dict
    (what `encode` writes, read back)."""
    return json.loads(encode(processes, origin))


def encode(processes: list[dict[str, Any]], origin: float) -> str:
    """The trace of `processes` (timeline.collect's, shifted to the driver's clock or not) as
    Chrome Trace Event Format JSON text (unshifted spans begun before `origin` left out): one
    track per process and thread, a complete ("X") event per span, flow arrows from a push
    to its apply. Each span is formatted straight from its tuple into one line of text (no
    dict per event), its args encoded once per distinct dict (a step's compute spans and a
    collective's wait and comm share theirs); times in µs to the nanosecond."""
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    meta: list[str] = []
    events: list[tuple] = []  # (pid, tid, ts, -dur, text): each track in time order
    encoded: dict[int, str] = {}
    pushes: dict[int, tuple] = {}
    applies: dict[int, list[tuple]] = {}
    for index, proc in enumerate(processes):
        pid = int(proc["pid"])
        ranks = sorted({s[4]["rank"] for s in proc["spans"]
                        if s[0] == phases.STEP and s[4] and "rank" in s[4]})
        label = proc["name"] + "".join(f" (replica {r})" for r in ranks)
        meta.append(f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,'
                    f'"args":{{"name":{dumps(label)}}}}}')
        meta.append(f'{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":0,'
                    f'"args":{{"sort_index":{index}}}}}')
        for tid in sorted({s[3] for s in proc["spans"]}):
            name = proc["threads"].get(tid, f"thread {tid}")
            meta.append(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},'
                        f'"args":{{"name":{dumps(name)}}}}}')
        # spans on the process's own clock (collect(shifted=False)) move to the driver's here
        own = proc.get("clock") == "own"
        base = origin + (proc["offset"] if own else 0.0)
        for name, start, end, tid, args in proc["spans"]:
            if own and start < base:  # begun before the window (collect filters the others)
                continue
            ts = round((start - base) * US, 3)  # both ends rounded alike: spans that
            dur = round(max(round((end - base) * US, 3) - ts, 0.0), 3)  # touch still do
            text = encoded.get(id(args))
            if text is None:
                text = encoded[id(args)] = dumps(args or _NO_ARGS)
            events.append((pid, tid, ts, -dur,
                           f'{{"name":"{name}","cat":"labdist","ph":"X","pid":{pid},'
                           f'"tid":{tid},"ts":{ts!r},"dur":{dur!r},"args":{text}}}'))
            if (name == "push" or name == "apply") and args and args.get("flow") is not None:
                if name == "push":
                    pushes[args["flow"]] = (pid, tid, ts)
                else:
                    applies.setdefault(args["flow"], []).append((pid, tid, ts))
    for flow, targets in applies.items():
        push = pushes.get(flow)
        if push is None:
            continue
        for n, (pid, tid, ts) in enumerate(targets):
            ident = f"{flow}.{n}"
            events.append((*push, 0.0,
                           f'{{"ph":"s","name":"push → apply","cat":"flow","id":"{ident}",'
                           f'"pid":{push[0]},"tid":{push[1]},"ts":{push[2]!r}}}'))
            events.append((pid, tid, ts, 0.0,
                           f'{{"ph":"f","bp":"e","name":"push → apply","cat":"flow",'
                           f'"id":"{ident}","pid":{pid},"tid":{tid},"ts":{ts!r}}}'))
    events.sort(key=_order)  # an enclosing span before the spans it holds
    other = dumps({"producer": "labdist", "origin_unix_s": origin})
    return (f'{{"traceEvents":[{",".join(meta + [e[4] for e in events])}],'
            f'"displayTimeUnit":"ms","otherData":{other}}}')


def _order(event: tuple) -> tuple:
    return event[:4]


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
        text = encode(timeline.collect(client, start, shifted=False), start)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)  # one write of the whole text
