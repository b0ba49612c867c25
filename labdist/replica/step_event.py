"""The step protocol's messages, both ways. The driver asks a replica to start a step
(`RunStep`) or to go on from merge_call (`ResumeStep`); the replica reports what came of each
part of a step (`StepEvent`), pickled once on the worker, where whatever cannot travel (a
result, merge_call arguments, a warning, an exception) becomes an error that says so instead
of breaking the connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labdist.errors import PeerAbortedError
from labdist.replica.lane import dumps
from labdist.shipping import picklable_error


@dataclass(frozen=True)
class RunStep:
    """Start step `run_id`: the step function `fn_ref` names (replica/loaded.py) with this
    replica's arguments, `steps` times."""

    run_id: int
    fn_ref: tuple
    args: tuple
    kwargs: dict
    steps: int = 1

    def __reduce__(self):  # the lane's hot path: a tuple's pickle, not a dataclass's state
        return RunStep, (self.run_id, self.fn_ref, self.args, self.kwargs, self.steps)


@dataclass(frozen=True)
class ResumeStep:
    """Go on from merge_call with its `value`, or raise `error` there."""

    value: Any = None
    error: BaseException | None = None

    def __reduce__(self):
        return ResumeStep, (self.value, self.error)


StepRequest = RunStep | ResumeStep


@dataclass
class StepEvent:
    """What a replica reports to the driver: its step finished ("done"), failed ("error"), or
    stopped in merge_call ("merge"). `seq` counts the collectives it has made so far."""

    kind: str
    seq: int
    value: Any = None
    error: BaseException | None = None
    remote_traceback: str = ""
    warnings: list[tuple[str, type]] = field(default_factory=list)

    @property
    def root_cause(self) -> bool:
        return self.kind == "error" and not isinstance(self.error, PeerAbortedError)


def step_error(error: BaseException, where: str, what: str = "the step function") -> Exception:
    """The exception the driver is told about. A BaseException that is no Exception (sys.exit,
    KeyboardInterrupt, GeneratorExit) becomes a RuntimeError naming it: re-raised as it is on
    the driver, it would end the driver's process (with status 0 for `sys.exit()`)."""
    if isinstance(error, Exception):
        return error
    shown = repr(error) if error.args else type(error).__name__
    return RuntimeError(
        f"{what} raised {shown} on {where}; a step cannot exit or interrupt its worker process "
        "(nor the driver). Raise an Exception to stop a step")


def encode(event: StepEvent, where: str) -> bytes | TypeError:
    """`event` pickled for the driver. A result that cannot be pickled becomes an error event
    naming `where` (the replica), a warning that cannot becomes its text; for a merge event
    whose arguments cannot travel, returns the TypeError its waiting step must raise."""
    if event.error is not None:
        event.error = picklable_error(event.error)
    try:
        return dumps(event)
    except Exception as e:
        problem = f"{type(e).__name__}: {e}"
    if event.kind == "merge":
        return TypeError(f"merge_call arguments on {where} cannot be sent to the driver "
                         f"({problem}); pass arrays, numbers and picklable objects")
    event.warnings = [_sendable_warning(w) for w in event.warnings]
    try:
        return dumps(event)
    except Exception as e:
        problem = f"{type(e).__name__}: {e}"
    if event.kind == "done":
        error: Exception = TypeError(
            f"the result of the step function on {where} cannot be sent to the driver "
            f"({problem}); return arrays, numbers and picklable objects (or structures of them)")
    else:
        error = RuntimeError(f"{type(event.error).__name__}: {event.error}")
    return dumps(StepEvent("error", event.seq, error=error, warnings=event.warnings,
                           remote_traceback=event.remote_traceback))


def _sendable_warning(warning: tuple[Any, Any]) -> tuple[Any, Any]:
    try:
        dumps(warning)
        return warning
    except Exception:
        message, category = warning
    try:
        dumps(category)
    except Exception:
        category = UserWarning
    return str(message), category
