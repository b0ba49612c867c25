"""Distributed variables: one handle, one copy per replica.

The handle is small and picklable. Inside `strategy.run` it resolves to the copy of the replica
running the step (replica context); on the driver it reads and writes every copy through the
strategy (cross-replica context); with no strategy it is an ordinary single-copy variable.
"""

from __future__ import annotations

import hashlib
import itertools
import weakref
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from labdist import aggregation as table
from labdist import checks, context, shipping
from labdist.autodiff import tape, unwrap
from labdist.enums import VariableAggregation, VariableSynchronization
from labdist.errors import ReplicaDivergenceWarning
from labdist.replica import replica_context

Sync = VariableSynchronization
Agg = VariableAggregation
_ids = itertools.count(1)
# The variables made in this process, so a handle coming back (a run result) is the variable
# itself, as in TF (`strategy.run(lambda: v) is v`).
_made: weakref.WeakValueDictionary[int, Variable] = weakref.WeakValueDictionary()
_MODES = ("assign", "assign_add", "assign_sub")
_CONSTANTS = (bool, int, float, complex, list, tuple)  # the same Python value on every replica


class Variable(NDArrayOperatorsMixin):
    """A variable with one copy per replica of the strategy in scope when it was created."""

    def __init__(
        self,
        initial_value: Any,
        trainable: bool | None = None,
        name: str | None = None,
        dtype: Any = None,
        synchronization: VariableSynchronization | str = Sync.AUTO,
        aggregation: VariableAggregation | str = Agg.NONE,
    ):
        if replica_context.current() is not None:
            raise ValueError(
                "variables are created under strategy.scope() on the driver, not inside "
                "strategy.run: create it before the step and pass it in (or close over it)"
            )
        checks.string("name", name, optional=True, empty_ok=True)  # TF: a string or None
        sync = Sync.parse(synchronization, "synchronization")
        agg = Agg.parse(aggregation, "aggregation")
        host = _initial_host(initial_value, dtype)
        if not table.of(agg).keeps_dtype(host.dtype):
            combined = table.of(agg).result_dtype(host.dtype).name
            raise ValueError(
                f"Variable {name or 'Variable'!r}: aggregation={agg.name} is not allowed for "
                f"dtype {host.dtype.name} (it combines copies into {combined}); use a float "
                "dtype or another aggregation (SUM, ONLY_FIRST_REPLICA)"
            )
        if trainable is None:
            trainable = sync is not Sync.ON_READ
        elif not isinstance(trainable, bool):
            raise TypeError(f"trainable={trainable!r} must be True, False or None")
        strategy = context.get_strategy()
        self._id = next(_ids)
        self._strategy_id = strategy.id
        self._name = name or "Variable"
        self._dtype = host.dtype
        self._shape = host.shape
        self._sync = sync
        self._agg = agg
        self._trainable = trainable
        strategy.extended.create_copies(self._id, host)
        _made[self._id] = self

    # -- identity -------------------------------------------------------------------------------
    name = property(lambda self: self._name)
    dtype = property(lambda self: self._dtype)
    shape = property(lambda self: self._shape)
    synchronization = property(lambda self: self._sync)
    aggregation = property(lambda self: self._agg)
    trainable = property(lambda self: self._trainable)

    @property
    def id(self) -> int:
        """Unique in this driver process: what replicas and parameter servers key this
        variable's copies by."""
        return self._id

    @property
    def strategy_id(self) -> str:
        """The `id` of the strategy holding its copies."""
        return self._strategy_id

    @property
    def _effective_sync(self) -> VariableSynchronization:
        return Sync.ON_WRITE if self._sync is Sync.AUTO else self._sync

    def __hash__(self) -> int:
        return hash((self._strategy_id, self._id))

    def __reduce__(self):
        state = (self._id, self._strategy_id, self._name, self._dtype.str, self._shape,
                 self._sync.name, self._agg.name, self._trainable)
        return (_rebuild, state)

    def __repr__(self) -> str:
        head = (f"<ld.Variable {self._name!r} shape={self._shape} dtype={self._dtype.name} "
                f"synchronization={self._sync.name} aggregation={self._agg.name}")
        try:
            return f"{head} value={self.numpy()!r}>"
        except Exception:
            return head + ">"

    # -- reads ------------------------------------------------------------------------------------
    def read_value(self) -> Any:
        """Replica context: a snapshot of the local copy. Cross-replica: the aggregated value.
        Under an open `ld.GradientTape` that watches it, the snapshot is recorded."""
        return tape.read(self, self._snapshot())

    value = read_value

    def _snapshot(self) -> Any:
        ctx = self._context()
        if ctx is not None:
            return ctx.local_copy(self).copy()
        return self._cross_read()

    def numpy(self) -> np.ndarray:
        """The value as a host numpy array (an explicit device-to-host copy)."""
        ctx = self._context()
        if ctx is not None:
            return ctx.backend.to_host(self._snapshot())
        return self._cross_read()

    def __array__(self, dtype=None, copy=None):
        ctx = self._context()
        if ctx is not None and ctx.backend.is_device:
            raise TypeError(
                f"Variable {self._name!r} lives on a device replica: implicit conversion to a "
                "host array is not allowed; use v.numpy() or to_host(v.read_value())"
            )
        return np.asarray(self.numpy(), dtype=dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        values = [x.read_value() if isinstance(x, Variable) else x for x in inputs]
        return getattr(ufunc, method)(*values, **kwargs)

    def __getitem__(self, index) -> Any:
        """A slice of the value (recorded on an open tape), as TensorFlow's `v[...]`."""
        return self.read_value()[index]

    def __float__(self) -> float:
        return float(self._snapshot())

    def __int__(self) -> int:
        return int(self._snapshot())

    # -- writes -----------------------------------------------------------------------------------
    def assign(self, value: Any, read_value: bool = True) -> Any:
        return self._update("assign", value, read_value)

    def assign_add(self, delta: Any, read_value: bool = True) -> Any:
        return self._update("assign_add", delta, read_value)

    def assign_sub(self, delta: Any, read_value: bool = True) -> Any:
        return self._update("assign_sub", delta, read_value)

    def _update(self, mode: str, value: Any, read_value: bool) -> Any:
        ctx = self._context()
        if ctx is not None:  # in a step: the replica context knows where the copy lives
            return ctx.apply_update(self, mode, value, read_value)
        result = self._cross_update(mode, value)
        return result if read_value else None

    def _context(self):
        ctx = replica_context.current()
        if ctx is not None:
            return ctx
        strategy = context.lookup(self._strategy_id)
        if context.is_default(strategy) and context.scoped_strategy() is None:
            return strategy.default_replica_context()
        return None

    # -- replica context (runs on the replica's worker) --------------------------------------
    def replica_update(self, ctx, mode: str, value: Any) -> Any:
        """How `assign*` lands on one replica's copy (called by `ctx.apply_update`): ON_WRITE
        with an aggregation all-reduces the update first; returns a snapshot of the copy."""
        local = ctx.local_copy(self)
        arr, constant = self._prepare(value, ctx.backend, mode, on_device=True)
        sync, agg, world = self._effective_sync, self._agg, ctx.num_replicas_in_sync
        if ctx.mode == "update" or sync is not Sync.ON_WRITE or agg is Agg.NONE:
            delta = arr  # local write: ON_READ and NONE aggregate at read time, or not at all
        elif constant:
            delta = self._reduce_constant(value, arr, world)
        else:
            what = f"Variable {self._name!r}.{mode} (aggregation {agg.name})"
            delta = ctx.reduce_arrays(what, [arr], agg)[0]
        _apply(local, mode, delta)
        if (sync is Sync.ON_WRITE and agg is Agg.NONE and ctx.mode == "replica" and world > 1
                and not ctx.is_diverged(self)):
            self._check_divergence(ctx, local, mode)
        return local.copy()

    def _reduce_constant(self, value: Any, arr: Any, world: int) -> Any:
        """TF's reduce of a non-distributed value: zeros stay zeros, MEAN/first keep it,
        SUM over several replicas is ambiguous."""
        if not np.any(np.asarray(value)) or self._agg is not Agg.SUM or world == 1:
            return arr
        raise ValueError(
            f"Variable {self._name!r} (ON_WRITE, aggregation SUM): the non-distributed value "
            f"{value!r} is the same constant on every replica, so summing it across {world} "
            "replicas is ambiguous. Pass a per-replica value (computed from the replica's "
            "inputs), use aggregation MEAN, or update inside merge_call with "
            "strategy.extended.update"
        )

    def _check_divergence(self, ctx, local: Any, mode: str) -> None:
        host = np.ascontiguousarray(ctx.backend.to_host(local))
        digest = hashlib.blake2b(host.tobytes(), digest_size=16).digest()
        digests = ctx.all_gather_object(f"divergence check of Variable {self._name!r}", digest)
        if len(set(digests)) > 1:
            ctx.mark_diverged(self)
            ctx.warn(
                f"Variable {self._name!r} (ON_WRITE, aggregation NONE): {mode} gave each "
                "replica its own value, so its copies now differ; cross-replica reads return "
                "replica 0's copy. Use aggregation SUM or MEAN to keep the copies in sync.",
                ReplicaDivergenceWarning,
            )

    # -- cross-replica context (driver) ------------------------------------------------------
    def _cross_read(self) -> np.ndarray:
        strategy = context.lookup(self._strategy_id)
        sync, agg = self._effective_sync, self._agg
        if sync is Sync.NONE:
            raise ValueError(
                f"Variable {self._name!r} has synchronization NONE: each replica owns its copy "
                "and there is no cross-replica value; use "
                "strategy.experimental_local_results(v) to see every copy"
            )
        if sync is Sync.ON_WRITE or agg is Agg.ONLY_FIRST_REPLICA:
            return strategy.extended.read_copies(self._id, [0])[0]
        if agg is Agg.NONE:
            raise ValueError(
                f"Variable {self._name!r} (ON_READ, aggregation NONE) has no cross-replica "
                "value; read it inside strategy.run, or use experimental_local_results(v)"
            )
        copies = strategy.extended.read_copies(self._id, range(strategy.num_replicas_in_sync))
        return table.of(agg).combine(copies)

    def _cross_update(self, mode: str, value: Any) -> Any:
        strategy = context.lookup(self._strategy_id)
        n = strategy.num_replicas_in_sync
        sync, agg = self._effective_sync, self._agg
        arr, _ = self._prepare(value, None, mode, on_device=False)
        if sync is Sync.ON_READ and (agg is Agg.NONE or (agg is Agg.SUM and mode != "assign")):
            raise ValueError(
                f"Variable {self._name!r} (ON_READ, aggregation {agg.name}): {mode} is not "
                "allowed in cross-replica context (nothing was written). "
                + ("Use assign(); it stores value / num_replicas in each copy."
                   if agg is Agg.SUM else "Give it aggregation SUM, MEAN or ONLY_FIRST_REPLICA.")
            )
        if sync is Sync.ON_READ and agg is Agg.SUM:  # assign: each copy holds its share
            share = np.trunc(arr / n) if arr.dtype.kind in "iu" else arr / n  # ints truncate
            arr = np.asarray(share).astype(self._dtype)
        if sync is Sync.NONE:
            strategy.extended.write_copies(self._id, mode, arr, want=())
            return None
        if mode == "assign":
            strategy.extended.write_copies(self._id, mode, arr, want=())
            return arr * n if (sync is Sync.ON_READ and agg is Agg.SUM) else arr.copy()
        want = [0] if (sync is Sync.ON_WRITE or agg is Agg.ONLY_FIRST_REPLICA) else range(n)
        copies = strategy.extended.write_copies(self._id, mode, arr, want=want)
        return copies[0] if len(copies) == 1 else table.of(agg).combine(copies)

    # -- validation ---------------------------------------------------------------------------
    def prepare_update(self, mode: str, value: Any, backend) -> Any:
        """What `assign*(value)` (`mode`) writes on a replica whose arrays are `backend`'s:
        `value` checked against this variable's dtype and shape (the errors name both), cast
        to its dtype. A parameter-server worker pushes it."""
        return self._prepare(value, backend, mode, on_device=True)[0]

    def check_assignable(self, value: Any, what: str = "assign") -> None:
        """Raise the error `assign(value)` would (a dtype of another kind, another shape)
        without writing anything: a caller writing several variables checks them all first."""
        self._check_spec(what, value, np.asarray(value).dtype, np.shape(value))

    def _prepare(self, value: Any, backend, mode: str, on_device: bool) -> tuple[Any, bool]:
        """Check `value` against this variable; return (array of its dtype, is_constant)."""
        if isinstance(value, Variable):
            value = value._snapshot()
        value = unwrap(value)  # a value a tape recorded: its array
        constant = isinstance(value, _CONSTANTS)
        if constant or isinstance(value, np.ndarray | np.generic):
            if on_device and backend.is_device and isinstance(value, np.ndarray):
                raise TypeError(
                    f"Variable {self._name!r}.{mode}: value is a host numpy array but this "
                    "replica's copy is on a device; move it with ctx.xp.asarray(value)"
                )
            host = np.asarray(value)
            if host.dtype == object:
                raise TypeError(f"Variable {self._name!r}.{mode}: value={value!r} is not numeric")
            self._check_spec(mode, value, host.dtype, host.shape)
            host = host.astype(self._dtype, copy=False)
            return (backend.to_device(host) if on_device else host), constant
        if backend is not None and backend.is_array(value):
            self._check_spec(mode, value, value.dtype, value.shape)
            return value.astype(self._dtype, copy=False), False
        raise TypeError(
            f"Variable {self._name!r}.{mode}: value={value!r} of type {type(value).__name__} "
            "is not an array or a number"
        )

    def _check_spec(self, mode: str, value: Any, dtype: Any, shape: tuple) -> None:
        if not np.can_cast(np.dtype(dtype), self._dtype, casting="same_kind"):
            raise TypeError(
                f"Variable {self._name!r}.{mode}: value of dtype {np.dtype(dtype).name} cannot "
                f"be written to a {self._dtype.name} variable (allowed: dtypes of the same kind "
                "or safer, e.g. int into float)"
            )
        if tuple(shape) != self._shape:
            raise ValueError(
                f"Variable {self._name!r}.{mode}: value has shape {tuple(shape)} but the "
                f"variable has shape {self._shape}; shapes must match"
            )


def _apply(copy: Any, mode: str, delta: Any) -> None:
    if mode == "assign":
        copy[...] = delta
    elif mode == "assign_add":
        copy += delta
    else:
        copy -= delta


def _initial_host(initial_value: Any, dtype: Any) -> np.ndarray:
    if callable(initial_value):
        initial_value = initial_value()
    if isinstance(initial_value, Variable):
        initial_value = initial_value.numpy()
    from labdist.devices import to_host

    initial_value = to_host(initial_value)
    if dtype is not None:
        try:
            dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"dtype={dtype!r} is not a numpy dtype: {e}") from None
    if isinstance(initial_value, np.ndarray):  # a view (broadcast_to) may stand for terabytes
        checks.array_bytes("initial_value", initial_value.shape,
                           (dtype or initial_value.dtype).itemsize)
    is_python = not isinstance(initial_value, np.ndarray | np.generic)
    try:
        host = np.array(initial_value, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"initial_value={initial_value!r} cannot be made an array: {e}") from None
    if host.dtype == object or host.dtype.kind not in "biufc":
        raise TypeError(f"initial_value={initial_value!r} is not numeric")
    if dtype is None and is_python:  # TF's defaults: Python floats are float32, ints int32
        if host.dtype == np.float64:
            host = host.astype(np.float32)
        elif host.dtype == np.int64:
            host = host.astype(np.int32)
    return host


def _rebuild(var_id, strategy_id, name, dtype, shape, sync, agg, trainable) -> Variable:
    made = _made.get(var_id)
    if made is not None and made._strategy_id == strategy_id:
        return made  # back where it was made: the variable itself
    v = Variable.__new__(Variable)
    v._id, v._strategy_id, v._name = var_id, strategy_id, name
    v._dtype, v._shape = np.dtype(dtype), tuple(shape)
    v._sync, v._agg, v._trainable = Sync[sync], Agg[agg], trainable
    return v


shipping.register_frozen(Variable)  # pickles to its handle, fixed at creation: cacheable
