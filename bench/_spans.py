"""Timing spans patched into a running process from outside, for bench/profile_step.py:
`install` wraps named functions and methods (labdist's own, by their import path) so each call
adds its time to a label, per thread; nothing of this lives in labdist, so an uninstrumented
run pays nothing at all. Exclusive time (a span less the spans it called) is kept beside
inclusive time, so the labels of one thread add up without double counting.

`mark`/`since` record hand-off latencies between threads (a timestamp taken on one, read on
another). Workers get this module by value (cloudpickle), as it is not importable there.
"""

from __future__ import annotations

import functools
import importlib
import resource
import threading
import time
from typing import Any

_local = threading.local()
_tables: list[tuple[str, dict]] = []  # (thread name, {label: [exclusive, inclusive, calls]})
_tables_lock = threading.Lock()
_patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
_marks: dict[str, int] = {}


def _table() -> tuple[list[int], dict]:
    state = getattr(_local, "state", None)
    if state is None:
        state = _local.state = ([], {})
        with _tables_lock:
            _tables.append((threading.current_thread().name, state[1]))
    return state


def add(label: str, ns: int) -> None:
    """Charge `ns` to `label` on this thread (a span measured by other means)."""
    stack, table = _table()
    rec = table.setdefault(label, [0, 0, 0])
    rec[0] += ns
    rec[1] += ns
    rec[2] += 1
    if stack:
        stack[-1] += ns


def spanned(fn, label: str):
    """`fn`, timed under `label`."""
    now = time.perf_counter_ns

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        stack, table = _table()
        stack.append(0)
        start = now()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = now() - start
            inner = stack.pop()
            if stack:
                stack[-1] += spent
            rec = table.get(label)
            if rec is None:
                rec = table[label] = [0, 0, 0]
            rec[0] += spent - inner
            rec[1] += spent
            rec[2] += 1

    wrapper.__spans_original__ = fn
    return wrapper


def mark(name: str) -> None:
    _marks[name] = time.perf_counter_ns()


def since(name: str, label: str) -> None:
    """Charge the time since `mark(name)` (on any thread) to `label` on this thread."""
    start = _marks.pop(name, None)
    if start is not None:
        add(label, time.perf_counter_ns() - start)


def _owner(path: str) -> tuple[Any, str]:
    """"pkg.module:Class.attr" or "pkg.module:function" -> (object holding it, attribute)."""
    module, _, rest = path.partition(":")
    owner: Any = importlib.import_module(module)
    *parents, attr = rest.split(".")
    for p in parents:
        owner = getattr(owner, p)
    return owner, attr


def install(spec: list[tuple[str, str]], hooks: list[tuple[str, Any]] = ()) -> list[str]:
    """Wrap each "module:Qualified.name" of `spec` under its label; `hooks` are (path, factory)
    pairs where factory(original) returns the replacement. Returns the paths not found (a
    renamed function: the profile says so instead of failing)."""
    missing = []
    for path, label in spec:
        try:
            owner, attr = _owner(path)
            original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        except (ImportError, AttributeError, KeyError):
            missing.append(path)
            continue
        _patched.append((owner, attr, original))
        setattr(owner, attr, spanned(original, label))
    for path, factory in hooks:
        try:
            owner, attr = _owner(path)
            original = getattr(owner, attr)
        except (ImportError, AttributeError):
            missing.append(path)
            continue
        _patched.append((owner, attr, original))
        setattr(owner, attr, factory(original))
    return missing


def uninstall() -> None:
    while _patched:
        owner, attr, original = _patched.pop()
        setattr(owner, attr, original)


def reset() -> dict[str, int]:
    """Forget what was collected; returns this process's page-fault counters now."""
    with _tables_lock:
        for _, table in _tables:
            table.clear()
    _marks.clear()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"minflt": usage.ru_minflt, "majflt": usage.ru_majflt}


def snapshot() -> dict[str, Any]:
    """{"threads": {thread name: {label: [exclusive ns, inclusive ns, calls]}}, "faults": ...}"""
    with _tables_lock:
        threads: dict[str, dict] = {}
        for name, table in _tables:
            merged = threads.setdefault(name, {})
            for label, rec in table.items():
                have = merged.setdefault(label, [0, 0, 0])
                for i in range(3):
                    have[i] += rec[i]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"threads": threads, "faults": {"minflt": usage.ru_minflt,
                                           "majflt": usage.ru_majflt}}
