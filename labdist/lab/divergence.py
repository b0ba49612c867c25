"""A run that diverged: a loss or a parameter became inf or NaN (usually a learning rate too
large). The runner checks every step's record; the first non-finite one pauses the run, and
this says in words where it happened."""

from __future__ import annotations

import numpy as np

from labdist.lab.engines import StepRecord
from labdist.lab.models import ParamSpec

ADVICE = "lower the learning rate and reset"


class DivergenceError(FloatingPointError):
    """The run diverged at `step`: `where` names the replica (or worker) and the value. The lab
    paused there; `lab.run()`, `lab.step()` and `lab.wait()` raise this until `lab.reset()`."""

    def __init__(self, step: int, where: str):
        self.step = step
        self.where = where
        super().__init__(f"the run diverged at step {step}: {where}; {ADVICE}")


def _number(value: float) -> str:
    return "nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")


def find(record: StepRecord, spec: ParamSpec, ps: bool) -> str | None:
    """What is not finite in `record`, in words (None when everything is)."""
    who = "worker" if ps else "replica"
    parts = []
    for r, (loss, n) in enumerate(zip(record.losses, record.sizes, strict=True)):
        if n and not np.isfinite(loss):  # nan with no samples: it did not compute
            parts.append(f"{who} {r}'s loss is {_number(loss)}")
    bad = ~np.isfinite(record.values)
    for r in np.flatnonzero(bad.any(axis=1)):
        names = [_element(spec, int(i)) for i in np.flatnonzero(bad[r])]
        shown = ", ".join(f"{name} = {_number(record.values[r, i])}" for name, i
                          in zip(names[:3], np.flatnonzero(bad[r])[:3], strict=False))
        more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
        copy = f"the value {who} {r} read" if ps else f"{who} {r}'s copy"
        parts.append(f"{copy} has {shown}{more}")
    return "; ".join(parts) or None


def _element(spec: ParamSpec, i: int) -> str:
    for k, name in enumerate(spec.names):
        lo, hi = spec.offsets[k], spec.offsets[k + 1]
        if lo <= i < hi:
            return name if spec.sizes[k] == 1 else f"{name}[{i - lo}]"
    return f"#{i}"
