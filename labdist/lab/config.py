"""`RunConfig`: every knob of a lab run in one immutable value, and the validation of changes.

A change is checked as a whole before anything is queued (an error names the parameter, the bad
value and what is allowed, and nothing changes); the runner applies the queued changes at the
next step boundary, all at once, on every replica.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from labdist import checks, network
from labdist.enums import VariableAggregation, VariableSynchronization


class Kind(StrEnum):
    """Which strategy a lab run steps through: the one value every part of the lab passes
    (a str, so `config.kind == "ps_async"` reads naturally)."""

    MIRRORED = "mirrored"
    PS_ASYNC = "ps_async"
    PS_SYNC = "ps_sync"

    @property
    def is_ps(self) -> bool:
        return self is not Kind.MIRRORED

    @property
    def ps_mode(self) -> str:
        """The ParameterServerStrategy mode ("async" / "sync") of a PS kind."""
        if not self.is_ps:
            raise ValueError(f"{self.value!r} is not a parameter-server kind")
        return self.value.removeprefix("ps_")

    @property
    def label(self) -> str:
        return {"mirrored": "mirrored", "ps_async": "PS async", "ps_sync": "PS sync"}[self.value]

    @classmethod
    def of_ps_mode(cls, mode: str) -> Kind:
        return cls("ps_" + mode)


class StrategyKey(NamedTuple):
    """What fixes a strategy when it is made: its kind, and use_locking for a PS (a change of
    either is a switch to another strategy)."""

    kind: Kind
    use_locking: bool = False


KINDS = tuple(k.value for k in Kind)
RESYNC = ("average", "first")
SYNCHRONIZATIONS = ("ON_WRITE", "ON_READ", "NONE")
AGGREGATIONS = ("SUM", "MEAN", "ONLY_FIRST_REPLICA", "NONE")
COMPRESSIONS = ("none", "fp16", "bf16", "topk", "powersgd")
MAX_LATENCY_S = 1.0  # the lab's range for a modelled link: a step still takes under seconds
MIN_BANDWIDTH = 1e3  # bytes per second

Sync = VariableSynchronization
Agg = VariableAggregation


@dataclass(frozen=True)
class RunConfig:
    """What a lab run does at each step.

    kind: "mirrored" (MirroredStrategy), "ps_async" / "ps_sync" (ParameterServerStrategy).
    synchronization: ON_WRITE (all-reduce every update), ON_READ (local updates; the copies
        are averaged every `sync_period` steps: local SGD) or NONE (local only). Mirrored only.
    aggregation: how ON_WRITE updates (mirrored) or a sync step's gradients (ps_sync) combine.
    learning_rate: the SGD step size.
    skew: replica r's share of every batch has its inputs shifted by `r * skew`.
    delays: seconds each replica / worker waits before its update (stragglers).
    use_locking: parameter servers serialise the updates of a variable.
    sync_period: ON_READ averages the copies every this many steps (0: never; 10 by default,
        so the copies are seen to part between two averages).
    resync: how copies that differ become one value when a switch needs one: "average" or
        "first" (replica 0's copy).
    pace: at most this many steps per second (0: as fast as possible), so people can watch.
    apply_delay: seconds a parameter server holds each chunk of an update before writing it
        (PS only; the lab keeps its parameters as one vector in up to 4 chunks). It widens
        the window in which two updates interleave, so torn reads and lost updates show
        within seconds without use_locking; 0: apply as fast as it goes (races then rare).
    compression: the gradient all-reduce's compressor, "none", "fp16", "bf16", "topk" (keeps
        `topk_ratio` of each gradient) or "powersgd" (rank `powersgd_rank`), with error
        feedback. Mirrored ON_WRITE with MEAN or SUM only, like the two below.
    local_steps: local SGD / DiLoCo: each replica steps alone for this many steps, then the
        replicas average their weight change and the outer optimizer (SGD with Nesterov
        momentum `outer_momentum`, learning rate `outer_lr`) applies it (0: off).
    synchronized_bn: batch norm sums its batch statistics across the replicas every step
        (Keras' `synchronized=True`), so every replica's moving statistics take the same
        update; off (default), each replica's copies follow its own slice and drift apart.
        Models with batch norm only (`ld.lab.BatchNormMLP`).
    latency, bandwidth: a slowed-down network (`ld.NetworkModel`) on every worker, mirrored
        and parameter-server kinds alike: seconds per message, bytes per second (None:
        unlimited). Both given as NetworkModel takes them ("5ms", "100MB/s"); latency 0 and
        bandwidth None: off. `network=` sets both at once (an `ld.NetworkModel`, or None /
        "off").
    """

    kind: Kind = Kind.MIRRORED
    synchronization: VariableSynchronization = Sync.ON_WRITE
    aggregation: VariableAggregation = Agg.MEAN
    learning_rate: float = 0.05
    skew: float = 0.0
    delays: tuple[float, ...] = ()
    use_locking: bool = False
    sync_period: int = 10  # ON_READ shows its copies part, then meet every 10 steps
    resync: str = "average"
    pace: float = 0.0
    apply_delay: float = 0.002
    compression: str = "none"
    topk_ratio: float = 0.01
    powersgd_rank: int = 1
    local_steps: int = 0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    synchronized_bn: bool = False
    latency: float = 0.0
    bandwidth: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _kind(self.kind))  # "ps_async" given as text

    @property
    def strategy_key(self) -> StrategyKey:
        """Which strategy runs this configuration (a change of it is a strategy switch)."""
        if not self.kind.is_ps:
            return StrategyKey(Kind.MIRRORED)
        return StrategyKey(self.kind, self.use_locking)

    def describe(self) -> str:
        if not self.kind.is_ps:
            mode = f"mirrored {self.synchronization.name}"
            if self.synchronization is Sync.ON_READ:
                mode += f" (average every {self.sync_period})" if self.sync_period else ""
            bn = ", synchronized batch norm" if self.synchronized_bn else ""
            return (f"{mode}, {self.aggregation.name}{bn}{self.describe_communication()}"
                    f"{self.describe_network()}")
        lock = ", use_locking" if self.use_locking else ""
        agg = f", {self.aggregation.name}" if self.kind is Kind.PS_SYNC else ""  # async: unused
        return f"{self.kind.label}{lock}{agg}{self.describe_network()}"

    @property
    def network(self) -> network.NetworkModel | None:
        """The modelled link this configuration asks for (None: full speed)."""
        if not self.latency and self.bandwidth is None:
            return None
        return network.NetworkModel(self.latency, self.bandwidth)

    def describe_network(self) -> str:
        """The slowed-down link, as text ("" when off)."""
        if self.network is None:
            return ""
        parts = [f"{self.latency * 1e3:g} ms"] if self.latency else []
        if self.bandwidth is not None:
            parts.append(f"{describe_rate(self.bandwidth)}")
        return ", link " + " + ".join(parts)

    def describe_communication(self) -> str:
        """The communication modes on, as text ("" when none)."""
        out = ""
        if self.compression != "none":
            param = {"topk": f" {self.topk_ratio:g}", "powersgd": f" rank {self.powersgd_rank}"}
            out += f", {self.compression}{param.get(self.compression, '')}"
        if self.local_steps:
            out += (f", DiLoCo H={self.local_steps} (outer lr {self.outer_lr:g}, momentum "
                    f"{self.outer_momentum:g})")
        return out

    @property
    def communicates_less(self) -> bool:
        """Whether a communication mode (compression, local SGD) is on."""
        return self.compression != "none" or self.local_steps > 0

    def changes_from(self, other: RunConfig) -> dict[str, tuple[Any, Any]]:
        """{field: (old, new)} for every field that differs from `other`."""
        out = {}
        for f in dataclasses.fields(self):
            old, new = getattr(other, f.name), getattr(self, f.name)
            if old != new:
                out[f.name] = (old, new)
        return out

    def replace(self, changes: Mapping[str, Any], num_replicas: int) -> RunConfig:
        """A new config with `changes` applied, every value checked (ValueError/TypeError
        naming the parameter; `self` is never modified)."""
        return validate(dataclasses.replace(self, **parse(changes, self, num_replicas)),
                        num_replicas)


FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))


def parse(changes: Mapping[str, Any], current: RunConfig, num_replicas: int) -> dict[str, Any]:
    """Each change as the field's type (names of enums and kinds accepted, case-insensitive)."""
    unknown = [k for k in changes if k not in FIELDS and k not in ("delay", "network")]
    if unknown:
        raise TypeError(f"unknown lab setting(s) {unknown}; allowed: {', '.join(FIELDS)} "
                        "(and delay={worker: seconds}, network=NetworkModel(...) or None)")
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "delay":
            out["delays"] = _merge_delay(value, out.get("delays", current.delays), num_replicas)
        elif name == "network":
            out.update(_network(value))
        else:
            out[name] = _PARSERS[name](value)
    return out


def validate(config: RunConfig, num_replicas: int) -> RunConfig:
    """Check the combination (delays per replica); returns the config."""
    if config.delays and len(config.delays) != num_replicas:
        raise ValueError(f"delays={list(config.delays)!r} must give one delay per replica "
                         f"({num_replicas} values)")
    if not config.delays:
        config = dataclasses.replace(config, delays=(0.0,) * num_replicas)
    if config.communicates_less and (config.kind.is_ps or config.synchronization
                                     is not Sync.ON_WRITE
                                     or config.aggregation not in (Agg.MEAN, Agg.SUM)):
        on = (f"compression={config.compression!r}" if config.compression != "none"
              else f"local_steps={config.local_steps!r}")
        raise ValueError(f"{on} is not allowed with {config.describe()}: the communication "
                         "modes apply to kind mirrored, synchronization ON_WRITE, aggregation "
                         "MEAN or SUM; set compression='none' and local_steps=0 first (or in "
                         "the same call)")
    return config


def _kind(value: Any) -> Kind:
    text = value.strip().lower().replace("-", "_") if isinstance(value, str) else None
    if text not in KINDS:
        raise ValueError(f"kind={value!r} is not allowed; allowed: {', '.join(KINDS)}")
    return Kind(text)


def _synchronization(value: Any) -> VariableSynchronization:
    sync = Sync.parse(value, "synchronization")
    if sync is Sync.AUTO:
        return Sync.ON_WRITE  # what AUTO means for the mirrored strategies
    return sync


def _aggregation(value: Any) -> VariableAggregation:
    return Agg.parse(value, "aggregation")


def _number(name: str, value: Any, low: float, low_open: bool, high: float = math.inf) -> float:
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and (value > low if low_open else value >= low)
          and value <= high)
    if not ok:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        if high != math.inf:
            bound += f" and <= {high:g}"
        raise ValueError(f"{name}={value!r} is not allowed; use a finite number {bound}")
    return float(value)


def _delays(value: Any) -> tuple[float, ...]:
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise TypeError(f"delays={value!r} must be a sequence of seconds, one per replica")
    return tuple(_number("delays", v, 0.0, False, 60.0) for v in value)


def _merge_delay(value: Any, delays: tuple[float, ...], n: int) -> tuple[float, ...]:
    if not isinstance(value, Mapping):
        raise TypeError(f"delay={value!r} must be a dict {{worker: seconds}}, e.g. {{1: 0.05}}")
    out = list(delays or (0.0,) * n)
    for worker, seconds in value.items():
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < n:
            raise ValueError(f"delay: worker={worker!r} is not allowed; use 0..{n - 1}")
        out[worker] = _number(f"delay[{worker}]", seconds, 0.0, False, 60.0)
    return tuple(out)


def _latency(value: Any) -> float:
    seconds = network.parse_latency(value)  # its ValueError names the accepted forms
    if seconds > MAX_LATENCY_S:
        raise ValueError(f"latency={value!r} is not allowed in the lab; use at most "
                         f"{MAX_LATENCY_S:g} s ({network.LATENCY_FORMS})")
    return seconds


def _bandwidth(value: Any) -> float | None:
    rate = network.parse_bandwidth(value)
    if rate < MIN_BANDWIDTH:
        raise ValueError(f"bandwidth={value!r} is not allowed in the lab; use at least "
                         f"{MIN_BANDWIDTH:g} bytes per second ({network.BANDWIDTH_FORMS})")
    return None if math.isinf(rate) else rate


def _network(value: Any) -> dict[str, Any]:
    """`network=`: a NetworkModel's latency and bandwidth, or None / "off" for full speed."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return {"latency": 0.0, "bandwidth": None}
    if isinstance(value, network.NetworkModel):
        return {"latency": _latency(value.latency), "bandwidth": _bandwidth(value.bandwidth)}
    raise TypeError(f"network={value!r} is not allowed; use ld.NetworkModel(latency=..., "
                    "bandwidth=...), or None / 'off' for full speed")


def describe_setting(name: str, value: Any) -> str | None:
    """A setting in the units the controls and the status line use (latency in ms, bandwidth
    as a rate), for event texts and chart marks; None: no unit to add."""
    if name == "latency" and isinstance(value, int | float):
        return f"{value * 1e3:g} ms"
    if name == "bandwidth":
        return "unlimited" if value is None else describe_rate(value)
    return None


def describe_rate(bytes_per_s: float) -> str:
    """"100 MB/s" for 1e8 (decimal units, as a link is quoted)."""
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:g} {unit}"
    return f"{bytes_per_s:g} B/s"


def _bool(name: str):
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not allowed; use True or False")
        return value
    return check


def _sync_period(value: Any) -> int:
    return checks.integer("sync_period", value, 0, meaning="0: never average")


def _resync(value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in RESYNC:
        raise ValueError(f"resync={value!r} is not allowed; allowed: {', '.join(RESYNC)}")
    return text


def _compression(value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in COMPRESSIONS:
        raise ValueError(f"compression={value!r} is not allowed; allowed: "
                         f"{', '.join(COMPRESSIONS)}")
    return text


def _integer(name: str, low: int, high: int, meaning: str = ""):
    def check(value: Any) -> int:
        return checks.integer(name, value, low, high, meaning=meaning)
    return check


_PARSERS = {
    "kind": _kind,
    "synchronization": _synchronization,
    "aggregation": _aggregation,
    "learning_rate": lambda v: _number("learning_rate", v, 0.0, True, 1e3),
    "skew": lambda v: _number("skew", v, 0.0, False, 1e3),
    "delays": _delays,
    "use_locking": _bool("use_locking"),
    "sync_period": _sync_period,
    "resync": _resync,
    "pace": lambda v: _number("pace", v, 0.0, False, 1e4),
    "apply_delay": lambda v: _number("apply_delay", v, 0.0, False, 0.1),
    "compression": _compression,
    "topk_ratio": lambda v: _number("topk_ratio", v, 0.0, True, 1.0),
    "powersgd_rank": _integer("powersgd_rank", 1, 64),
    "local_steps": _integer("local_steps", 0, 10_000, "0: off"),
    "outer_lr": lambda v: _number("outer_lr", v, 0.0, True, 10.0),
    "outer_momentum": lambda v: _number("outer_momentum", v, 0.0, False, 0.999),
    "synchronized_bn": _bool("synchronized_bn"),
    "latency": _latency,
    "bandwidth": _bandwidth,
}
