"""Argument checks shared by every layer, so a refusal always reads the same way:
`<parameter>=<value> is not allowed; use <what is allowed>`.

Numbers: nan and ±inf are refused unless a check says otherwise (a timeout may be math.inf
where that means "wait forever"); booleans are not numbers here, though Python says they are.
Huge finite values are allowed where they only make training diverge (a learning rate of
1e30), since labdist cannot know the scale of a user's problem; sizes that would exhaust the
machine (an array, a process count) are bounded where they are made (`array_bytes`,
`cluster/capacity.py`).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

# An array larger than this share of the machine's physical memory is refused before it is
# allocated: every replica holds a copy, so one this large could not be held anyway.
MAX_ARRAY_SHARE = 0.5


def refuse(name: str, value: Any, allowed: str, error: type[Exception] = ValueError):
    """Raise `error` naming the parameter, its value and what is allowed."""
    raise error(f"{name}={value!r} is not allowed; use {allowed}")


def is_number(value: Any) -> bool:
    """A real number (Python or numpy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def number(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *,
           low_open: bool = False, high_open: bool = False, infinite_ok: bool = False,
           allowed: str | None = None) -> float:
    """`value` as a float if it is a real number in the range (nan never; ±inf only where
    `infinite_ok`), else ValueError."""
    ok = is_number(value) and not math.isnan(value) and (infinite_ok or math.isfinite(value))
    if ok:
        ok = (value > low if low_open else value >= low) and \
             (value < high if high_open else value <= high)
    if not ok:
        refuse(name, value, allowed or _range(low, high, low_open, high_open, infinite_ok))
    return float(value)


def positive(name: str, value: Any, *, infinite_ok: bool = False, unit: str = "") -> float:
    """A finite number > 0 (or math.inf where `infinite_ok`), e.g. a timeout or a rate."""
    allowed = f"a finite number{' of ' + unit if unit else ''} > 0"
    if infinite_ok:
        allowed += " or math.inf"
    return number(name, value, 0.0, low_open=True, infinite_ok=infinite_ok, allowed=allowed)


def fraction(name: str, value: Any) -> float:
    """A number in [0, 1), e.g. a momentum, a decay or a dropout rate."""
    return number(name, value, 0.0, 1.0, high_open=True)


def integer(name: str, value: Any, minimum: int | None = None, maximum: int | None = None,
            *, optional: bool = False, meaning: str = "",
            error: type[Exception] = ValueError) -> int | None:
    """An int (Python or numpy, not bool) in [minimum, maximum]; None too where `optional`.
    `meaning` says in the refusal what the number counts; `error`: TypeError where only the
    type is checked (an axis)."""
    if value is None and optional:
        return None
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok:
        ok = (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        allowed = "an integer"
        if minimum is not None and maximum is not None:
            allowed += f" in {minimum}..{maximum}"
        elif minimum is not None:
            allowed += f" >= {minimum}"
        elif maximum is not None:
            allowed += f" <= {maximum}"
        allowed += " or None" if optional else ""
        refuse(name, value, allowed + (f" ({meaning})" if meaning else ""), error)
    return int(value)


def string(name: str, value: Any, *, optional: bool = False, empty_ok: bool = False) -> str | None:
    """A str (non-empty unless `empty_ok`); None too where `optional`."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        refuse(name, value, "a string" + (" or None" if optional else ""), TypeError)
    if not value and not empty_ok:
        refuse(name, value, "a non-empty string")
    return value


def boolean(name: str, value: Any) -> bool:
    """True or False (numpy's bool too), never 1 or "yes"."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        refuse(name, value, "True or False", TypeError)
    return bool(value)


def physical_memory() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def array_bytes(name: str, shape: tuple, itemsize: int) -> int:
    """The bytes of an array of `shape` and `itemsize`, refused (ValueError naming `name`, the
    shape, its size and the limit) when larger than MAX_ARRAY_SHARE of physical memory."""
    count = math.prod(int(d) for d in shape)
    size = count * int(itemsize)
    limit = int(physical_memory() * MAX_ARRAY_SHARE)
    if limit and size > limit:
        raise ValueError(
            f"{name} of shape {tuple(int(d) for d in shape)} would take {gib(size)} "
            f"({count} elements of {itemsize} bytes); allowed: at most {gib(limit)}, half of "
            f"this machine's {gib(physical_memory())} of memory")
    return size


def gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"


def _range(low: float, high: float, low_open: bool, high_open: bool, infinite_ok: bool) -> str:
    kind = "a number" if infinite_ok else "a finite number"
    if low == -math.inf and high == math.inf:
        return kind
    if high == math.inf:
        return f"{kind} {'>' if low_open else '>='} {low:g}"
    if low == -math.inf:
        return f"{kind} {'<' if high_open else '<='} {high:g}"
    return f"{kind} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
