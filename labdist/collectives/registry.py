"""The transports a replica group can choose from: name (the `transport=` knob value that
requires it) -> class, in preference order within each layer. Adding a transport is its module
under transports/ and one line here; the knob accepts its name from then on.

The knob: "auto" takes, for each layer, the first transport every replica can open and reach
every peer with (host: shm, else Dask comms; device: NCCL, else none, so device data goes
through the host). A transport's name requires it for its layer and leaves the other layers on
"auto", unless the transport stands `alone` ("tcp": Dask comms only).
"""

from __future__ import annotations

from labdist.collectives.transports.dask import DaskTransport
from labdist.collectives.transports.nccl import NcclTransport
from labdist.collectives.transports.protocol import DEVICE, HOST, Endpoint, Transport
from labdist.collectives.transports.shm import ShmTransport

TRANSPORTS: dict[str, type[Transport]] = {
    ShmTransport.name: ShmTransport,
    DaskTransport.name: DaskTransport,
    NcclTransport.name: NcclTransport,
}
AUTO = "auto"
FALLBACK = DaskTransport.name  # what a group talks over until it has chosen: works anywhere
LAYERS = (HOST, DEVICE)


def knob_values() -> tuple[str, ...]:
    return (AUTO, *TRANSPORTS)


def parse(value: object, parameter: str = "transport",
          aliases: dict[str, str] | None = None) -> str:
    """The knob value `value` names (through `aliases`, an older spelling's values, if
    given); a ValueError naming `parameter`, the value and what is allowed otherwise."""
    allowed = aliases if aliases is not None else {v: v for v in knob_values()}
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"{parameter}={value!r} is not supported; allowed: {', '.join(allowed)}")
    return allowed[value]


def candidates(knob: str, layer: str) -> list[str]:
    """The transports to try for `layer`, best first, under knob value `knob`."""
    if knob == AUTO:
        return [name for name, cls in TRANSPORTS.items() if cls.layer == layer]
    named = TRANSPORTS[knob]
    if named.layer == layer:
        return [knob]
    return [] if named.alone else candidates(AUTO, layer)


def required(knob: str, layer: str) -> bool:
    """Whether `knob` names this layer's transport: then not having it is an error."""
    return knob != AUTO and TRANSPORTS[knob].layer == layer


def create(name: str, endpoint: Endpoint) -> Transport:
    return TRANSPORTS[name](endpoint)
