"""One process's recorded spans as Chrome Trace Event Format text, formatted where they were
recorded: at a trace's end every worker formats its own spans at once (the workers are idle
then), so the driver only joins ready text instead of unpickling and formatting every span.

`fragment` formats a process's spans; `worker_fragment` is what the driver runs on each worker
(`client.run`) with the worker's clock offset. labdist/cluster/trace.py joins the fragments
(and formats the driver's own spans with the same `fragment`, so both give the same text).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from operator import itemgetter
from typing import Any

from labdist import phases

US = 1e6
NS = 1e9  # a span's times in integer ns after the origin (µs to 3 decimals)
_SLACK = 1e-15  # a product this near a half (a few ulps) is rounded the exact way
_NO_ARGS: dict = {}
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


_order = itemgetter(0, 1, 2)


def _ns(seconds: float) -> int:
    """round(seconds * 1e6, 3) * 1000 as an int, the exact rule: for a time whose ns lie
    within rounding error of a half (elsewhere `round(seconds * 1e9)` is the same, and a
    third of the cost; three round(x, 3) a span were a third of formatting it)."""
    return round(round(seconds * US, 3) * 1000.0)


def fragment(spans: list[tuple], pid: int, name: str, threads: dict[int, str], base: float,
             windowed: bool) -> dict[str, Any]:
    """Process `pid`'s `spans` (name, start, end, thread id, args) as trace text, times in µs
    after `base` (the trace's origin on this process's clock); `windowed`: spans begun before
    `base` left out. Returns `pid`; `process` (its process_name event) and `threads` (its
    thread_name events); `pieces`, its complete ("X") events, each track in time order
    (an enclosing span before the spans it holds), joined by commas and cut at `cuts`
    ((thread, µs) where a flow arrow's end belongs: after that track's events begun by then);
    `ends`, the push / apply flow endpoints (kind, flow id, thread, µs) in span order."""
    ranks = sorted({s[4]["rank"] for s in spans
                    if s[0] == phases.STEP and s[4] and "rank" in s[4]})
    label = name + "".join(f" (replica {r})" for r in ranks)
    process = (f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,'
               f'"args":{{"name":{_dumps(label)}}}}}')
    thread_meta = [f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},'
                   f'"args":{{"name":{_dumps(threads.get(tid, f"thread {tid}"))}}}}}'
                   for tid in sorted({s[3] for s in spans})]
    events: list[tuple] = []  # (tid, ts in ns, -dur in ns, text)
    ends: list[tuple] = []
    encoded: dict[int, str] = {}  # a step's compute spans, a collective's wait and comm: one
    heads: dict[tuple, str] = {}  # (name, thread) -> an event's text up to its time
    append = events.append
    for name_, start, end, tid, args in spans:
        if windowed and start < base:  # begun before the window
            continue
        # µs to the nanosecond, both ends rounded alike (spans that touch still do): ts is
        # round((start - base) * 1e6, 3), dur round(max(end's - ts, 0), 3), in integer ns
        scaled = (start - base) * NS
        ns = round(scaled)
        if abs(abs(scaled - ns) - 0.5) <= _SLACK * (abs(scaled) + 1.0):  # near a half:
            ns = _ns(start - base)  # as round(x, 3) decides
        scaled = (end - base) * NS
        dur = round(scaled)
        if abs(abs(scaled - dur) - 0.5) <= _SLACK * (abs(scaled) + 1.0):
            dur = _ns(end - base)
        dur = dur - ns if dur > ns else 0
        text = encoded.get(id(args))
        if text is None:
            text = encoded[id(args)] = _dumps(args or _NO_ARGS)
        head = heads.get((name_, tid))
        if head is None:
            head = heads[(name_, tid)] = (f'{{"name":"{name_}","cat":"labdist","ph":"X",'
                                          f'"pid":{pid},"tid":{tid},"ts":')
        ts = ns / 1000  # correctly rounded: the float round(..., 3) gives
        append((tid, ns, -dur, f'{head}{ts!r},"dur":{dur / 1000!r},"args":{text}}}'))
        if (name_ == "push" or name_ == "apply") and args and args.get("flow") is not None:
            ends.append((name_, args["flow"], tid, ts))
    events.sort(key=_order)  # stable: spans alike stay in recorded order
    texts = [e[3] for e in events]
    cuts = sorted({(tid, ts) for _, _, tid, ts in ends})
    pieces = []
    if cuts:
        keys = [(e[0], e[1] / 1000) for e in events]
        at = 0
        for cut in cuts:  # a flow event sorts after the track's events begun at or before it
            to = bisect_right(keys, cut)
            pieces.append(",".join(texts[at:to]))
            at = to
        pieces.append(",".join(texts[at:]))
    else:
        pieces.append(",".join(texts))
    return {"pid": pid, "process": process, "threads": thread_meta, "pieces": pieces,
            "cuts": cuts, "ends": ends}


def worker_fragment(since: float, origin: float, offsets: dict[str, float],
                    dask_worker: Any = None) -> dict[str, Any] | None:
    """This worker's spans that ended after `since` (on its clock) as trace text, its times in
    µs after `origin` (driver's clock) shifted by its offset in `offsets` (worker address ->
    seconds its clock runs ahead of the driver's). None when `offsets` lacks this worker (the
    driver measures it and asks again). Run by `client.run`, which passes `dask_worker`."""
    address = dask_worker.address
    if address not in offsets:
        return None
    snap = phases.snapshot(since)
    found = fragment(snap["spans"], snap["pid"], address, snap["threads"],
                     origin + offsets[address], True)
    found["name"] = address
    return found
