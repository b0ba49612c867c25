"""How a scheduled function ended, as the worker reports it to the coordinator: one small typed
value instead of tuples keyed by strings, so both sides read the same fields by name.

The worker makes OK, ERROR, RETRY and PS_LOST; the coordinator adds WORKER_LOST and CLOSED for
what it sees itself (the worker's process gone, the strategy closing). Errors come back as
values: a raised one would look like the worker failing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Ending(enum.Enum):
    OK = "ok"  # `value` is the function's result
    ERROR = "error"  # `value` is the function's exception, `traceback` the worker's text
    RETRY = "retry"  # released from a sync step's barrier (a worker was lost): run it later
    PS_LOST = "ps_lost"  # a parameter server could not be reached or answered nothing
    WORKER_LOST = "worker_lost"  # the worker running it left (seen by the coordinator)
    CLOSED = "closed"  # the strategy closed before it finished (seen by the coordinator)


@dataclass(frozen=True)
class Outcome:
    """One scheduled function's ending. A worker's PS_LOST names the parameter server
    (`ps_index`, None when the worker could not tell), how long it was silent (`silent_s`:
    None when it refused or dropped the connection rather than answering nothing) and the
    worker's `message`; the coordinator turns it into a PS_LOST whose `value` is the error
    the driver raises."""

    ending: Ending
    value: Any = None
    traceback: str = ""
    message: str = ""
    ps_index: int | None = None
    silent_s: float | None = None

    @classmethod
    def ok(cls, value: Any) -> Outcome:
        return cls(Ending.OK, value)

    @classmethod
    def error(cls, error: BaseException, traceback: str = "") -> Outcome:
        return cls(Ending.ERROR, error, traceback)

    @property
    def finished(self) -> bool:
        """Whether the function ran to an end of its own (a result or its error): the
        worker that ran it keeps dispatching."""
        return self.ending in (Ending.OK, Ending.ERROR)
