"""The tf.distribute enums. Members also accept their names as strings, case-insensitively."""

from __future__ import annotations

import enum


class _NamedEnum(enum.Enum):
    """An enum whose members can be given by name ("ON_READ", "sum")."""

    @classmethod
    def parse(cls, value: object, parameter: str | None = None):
        """Return the member for `value` (a member or its name), or raise a ValueError naming it."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            member = cls.__members__.get(value.strip().upper())
            if member is not None:
                return member
        allowed = ", ".join(cls.__members__)
        name = parameter or cls.__name__
        raise ValueError(f"{name}={value!r} is not a valid {cls.__name__}; allowed: {allowed}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class VariableSynchronization(_NamedEnum):
    """When the copies of a distributed variable are made to agree."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3


class VariableAggregation(_NamedEnum):
    """How replica-context updates (ON_WRITE) or reads (ON_READ) combine the replicas' values."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3


class ReduceOp(_NamedEnum):
    """The reduction of `all_reduce` and `strategy.reduce`."""

    SUM = "SUM"
    MEAN = "MEAN"


class InputReplicationMode(_NamedEnum):
    """How `distribute_datasets_from_function` makes pipelines: one per worker (shared by its
    replicas) or one per replica."""

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"
