"""One process's recorded spans as Chrome Trace Event Format text, formatted where they were
recorded: at a trace's end every worker formats its own spans at once (the workers are idle
then), so the driver only joins ready text instead of unpickling and formatting every span.

`fragment` formats a process's spans; `worker_fragment` is what the driver runs on each worker
(`client.run`) with the worker's clock offset. labdist/timing/trace.py joins the fragments
(and formats the driver's own spans with the same `fragment`, so both give the same text).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from labdist.timing import phases

US = 1e6
NS = 1e9  # a span's times in integer ns after the origin (µs to 3 decimals)
_SLACK = 1e-15  # a product this near a half (a few ulps) is rounded the exact way
_NO_ARGS: dict = {}
_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# json's C encoder made once (JSONEncoder.encode makes one a call: most of a small dict's
# cost); the same text, without the circular-reference check a span's flat args never need
_encoder = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, _json.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)


def _dumps(value: Any) -> str:
    return "".join(_encoder(value, 0)) if _encoder else _json.encode(value)


def _ns(seconds: np.ndarray) -> np.ndarray:
    """round(seconds * 1e6, 3) * 1000 as integers: `rint(seconds * 1e9)` is the same and far
    cheaper, except for a product within its rounding error of a half, where the exact rule
    decides (round(x, 3) three times a span was a third of the formatting)."""
    scaled = seconds * NS
    out = np.rint(scaled)
    near = np.flatnonzero(np.abs(np.abs(scaled - out) - 0.5) <= _SLACK * (np.abs(scaled) + 1))
    for i in near.tolist():
        out[i] = round(round(float(seconds[i]) * US, 3) * 1000.0)
    return out.astype(np.int64)


def _after(order: list[int], tids: tuple, ts: list[float], cut: tuple, lo: int) -> int:
    """The position in `order` of the first event after `cut` (thread, µs), from `lo`."""
    hi = len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        i = order[mid]
        if cut < (tids[i], ts[i]):
            hi = mid
        else:
            lo = mid + 1
    return lo


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
    ends: list[tuple] = []
    pieces: list[str] = []
    cuts: list[tuple] = []
    if spans:
        names, starts, stops, tids, argss = zip(*spans, strict=True)
        begun = np.array(starts) - base
        ns, dur = _ns(begun), _ns(np.array(stops) - base)  # µs to the nanosecond, both ends
        dur -= ns  # rounded alike (spans that touch still do)
        np.maximum(dur, 0, out=dur)
        tid_array = np.array(tids, dtype=np.int64)
        kept = np.flatnonzero(begun >= 0) if windowed else np.arange(len(spans))  # the window
        # each track in time order, an enclosing span first, spans alike in recorded order
        order = kept[np.lexsort((-dur[kept], ns[kept], tid_array[kept]))].tolist()
        ts_list, dur_list = (ns / 1000).tolist(), (dur / 1000).tolist()  # as round(., 3)
        encoded: dict[int, str] = {}  # a step's compute spans, a collective's wait and comm
        heads: dict[tuple, str] = {}  # (name, thread) -> an event's text up to its time
        texts = []
        for i in order:
            args = argss[i]
            text = encoded.get(id(args))
            if text is None:
                text = encoded[id(args)] = _dumps(args or _NO_ARGS)
            head = heads.get((names[i], tids[i]))
            if head is None:
                head = heads[(names[i], tids[i])] = (
                    f'{{"name":"{names[i]}","cat":"labdist","ph":"X","pid":{pid},'
                    f'"tid":{tids[i]},"ts":')
            texts.append(f'{head}{ts_list[i]!r},"dur":{dur_list[i]!r},"args":{text}}}')
        for i in kept.tolist():
            if names[i] == "push" or names[i] == "apply":
                args = argss[i]
                if args and args.get("flow") is not None:
                    ends.append((names[i], args["flow"], tids[i], ts_list[i]))
        cuts = sorted({(tid, ts) for _, _, tid, ts in ends})
        at = 0
        for cut in cuts:  # a flow event sorts after the track's events begun at or before it
            to = _after(order, tids, ts_list, cut, at)
            pieces.append(",".join(texts[at:to]))
            at = to
        pieces.append(",".join(texts[at:]))
    else:
        pieces.append("")
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
