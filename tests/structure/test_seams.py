"""The declared seams hold: every class on the far side of a seam implements each member its
Protocol declares (a method, or a capability as an attribute), so no caller needs to probe
with getattr / hasattr. A member added to a Protocol and forgotten in one implementation
fails here, naming both."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from labdist.cluster.dask_group import DaskReplicaGroup
from labdist.collectives.communicator import SoloTransport
from labdist.collectives.transports.dask import DaskTransport
from labdist.collectives.transports.loopback import LoopbackTransport
from labdist.collectives.transports.nccl import NcclTransport
from labdist.collectives.transports.protocol import DeviceTransport, HostTransport
from labdist.collectives.transports.shm import ShmTransport
from labdist.lab.engines import Engine, MirroredEngine
from labdist.lab.ps_engine import ParameterServerEngine
from labdist.parameter_server.actors import ParameterServerGroup
from labdist.strategies.one_device import LocalReplicaGroup
from labdist.strategies.replica_group import ReplicaGroup

SEAMS = [
    (ReplicaGroup, [LocalReplicaGroup, DaskReplicaGroup, ParameterServerGroup]),
    (HostTransport, [DaskTransport, LoopbackTransport, ShmTransport, SoloTransport]),
    (DeviceTransport, [NcclTransport]),
    (Engine, [MirroredEngine, ParameterServerEngine]),
]


def members(protocol: type) -> set[str]:
    """What a Protocol declares, its bases' included: methods and annotated attributes."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object) or not getattr(cls, "_is_protocol", False):
            continue
        names |= {n for n, v in vars(cls).items()
                  if inspect.isfunction(v) and not n.startswith("_")}
        names |= {n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")}
    return names


def instance_attributes(cls: type) -> set[str]:
    """Attributes an implementation sets on `self` in its __init__ (read from the source)."""
    source = inspect.getsource(cls.__init__) if "__init__" in vars(cls) else ""
    found = set()
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("self.") and "=" in line:
            for target in line.split("=")[0].split(","):
                target = target.strip()
                if target.startswith("self."):
                    found.add(target[len("self."):].split(":")[0].strip())
    return found | {a for base in cls.__mro__[1:-1] for a in instance_attributes(base)}


@pytest.mark.parametrize(("protocol", "implementations"), SEAMS,
                         ids=[p.__name__ for p, _ in SEAMS])
def test_every_implementation_has_every_declared_member(protocol, implementations):
    declared = members(protocol)
    assert declared, protocol
    missing = {impl.__name__: sorted(n for n in declared if not hasattr(impl, n)
                                     and n not in instance_attributes(impl))
               for impl in implementations}
    assert not any(missing.values()), f"{protocol.__name__}: missing {missing}"


def test_the_group_capabilities_say_what_each_group_does():
    """Declared, not probed: where steps run, where input may move."""
    assert LocalReplicaGroup.runs_steps and DaskReplicaGroup.runs_steps
    assert not ParameterServerGroup.runs_steps
    assert DaskReplicaGroup.remote_input
    assert not LocalReplicaGroup.remote_input and not ParameterServerGroup.remote_input
    assert NcclTransport.bootstraps
    assert not any(t.bootstraps for t in (DaskTransport, LoopbackTransport, ShmTransport,
                                          SoloTransport))
    assert ShmTransport.reads_in_place  # peers map its data area: one copy for every reader
    assert not any(t.reads_in_place for t in (DaskTransport, LoopbackTransport, SoloTransport))
