"""A network you can slow down: a latency and a bandwidth that labdist's own transports honour,
so a learner sees a sync all-reduce stretch with the link while async workers keep computing.

The model is per process (each worker's outgoing link): a collective's exchange, or a
parameter-server pull or push, takes at least `latency + bytes / bandwidth` of the bytes it
sent (pull: received): the process sleeps for what the real transfer left of it (the machine's
own transport is the model's infinitely fast wire). An all-reduce then takes what the
standard cost model says for its algorithm (`predict`). Off by default; when off, the hot
path pays one global read.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

DURATION_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
RATE_UNITS = {"B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2.0 ** 10, "MiB": 2.0 ** 20,
              "GiB": 2.0 ** 30, "bit": 1 / 8, "Kbit": 1e3 / 8, "Mbit": 1e6 / 8, "Gbit": 1e9 / 8}
_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"
_DURATION = re.compile(_NUMBER + "(" + "|".join(DURATION_UNITS) + r")\s*$")
_RATE = re.compile(_NUMBER + "(" + "|".join(RATE_UNITS) + r")/s\s*$")
LATENCY_FORMS = "a number of seconds >= 0, or a string like '5ms', '200us', '0.1s'"
BANDWIDTH_FORMS = ("a number of bytes per second > 0, None (unlimited), or a string like "
                   "'100MB/s', '1GiB/s', '10Gbit/s' (units: " + ", ".join(RATE_UNITS) + ")")


def parse_latency(value: Any) -> float:
    """Seconds from a number or a string with a unit; ValueError naming the accepted forms."""
    seconds = _parse(value, _DURATION, DURATION_UNITS)
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"latency={value!r} is not allowed; use {LATENCY_FORMS}")
    return seconds


def parse_bandwidth(value: Any) -> float:
    """Bytes per second (inf for None); ValueError naming the accepted forms."""
    if value is None:
        return math.inf
    rate = _parse(value, _RATE, RATE_UNITS)
    if rate is None or math.isnan(rate) or rate <= 0:
        raise ValueError(f"bandwidth={value!r} is not allowed; use {BANDWIDTH_FORMS}")
    return rate


def _parse(value: Any, pattern: re.Pattern, units: dict[str, float]) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (m := pattern.match(value)):
        return float(m.group(1)) * units[m.group(2)]
    return None


@dataclass(frozen=True)
class NetworkModel:
    """`latency` per message and `bandwidth` of each worker's link, e.g.
    `NetworkModel(latency="5ms", bandwidth="100MB/s")`. `apply(strategy)` puts it on every
    worker of the strategy's cluster (or those in `workers=`); `NetworkModel.off(strategy)`
    takes it away."""

    latency: float | str = 0.0
    bandwidth: float | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "latency", parse_latency(self.latency))
        object.__setattr__(self, "bandwidth", parse_bandwidth(self.bandwidth))

    def seconds(self, nbytes: int) -> float:
        """The modelled time of one message of `nbytes` over this link."""
        return self.latency + nbytes / self.bandwidth

    def predict(self, nbytes: int, world: int, algorithm: str = "direct") -> float:
        """Modelled seconds of one all-reduce of `nbytes` per replica over `world` replicas
        ("direct": one round, each sends everything to every peer; "reduce_scatter": two
        rounds of 1/world of it to each peer), or of a PS "pull"/"push" of `nbytes`."""
        if algorithm in ("pull", "push"):
            return self.seconds(nbytes)
        if world <= 1:
            return 0.0
        if algorithm == "direct":
            return self.seconds(nbytes * (world - 1))
        if algorithm == "reduce_scatter":
            return 2 * self.seconds(nbytes * (world - 1) // world)
        raise ValueError(f"algorithm={algorithm!r}; allowed: direct, reduce_scatter, pull, "
                         "push")

    def apply(self, target: Any, workers: list[str] | None = None) -> None:
        """Use this model on the workers of `target` (a strategy or a distributed.Client), or
        only on the worker addresses in `workers`."""
        _client(target).run(install, self, workers=workers)

    @staticmethod
    def off(target: Any, workers: list[str] | None = None) -> None:
        """A full-speed network again (on `workers`, default all)."""
        _client(target).run(install, None, workers=workers)


def _client(target: Any) -> Any:
    return getattr(target, "client", target)


CURRENT: NetworkModel | None = None  # this process's link, if slowed down


def install(model: NetworkModel | None) -> None:
    """Slow this process's link down to `model` (None: full speed). Run on each worker."""
    global CURRENT
    CURRENT = model


def delay(nbytes: int, spent: float = 0.0) -> None:
    """Make one message of `nbytes` take its modelled time on this process's link (if
    any), of which the real transfer already took `spent` seconds."""
    model = CURRENT
    if model is not None:
        left = model.seconds(nbytes) - spent
        if left > 0:
            time.sleep(left)
