"""The typed values the parameter-server actors exchange (parameter_server/settings.py,
push.py): they pickle as Dask sends them, a push's aggregation is the enum member (a name is
refused), and a push crosses the same-host path (shm_wire.py) with its arrays through the
worker's area and everything else, the aggregation included, as it was sent. No Dask here: a
real ShmServer and ShmPaths on this process, with a stand-in store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import pickle
import threading

import numpy as np
import pytest

from labdist.collectives.compression import FP16
from labdist.enums import VariableAggregation
from labdist.parameter_server.compressed_push import Packed
from labdist.parameter_server.push import Push
from labdist.parameter_server.settings import PsSettings
from labdist.parameter_server.shm_client import ShmPaths
from labdist.parameter_server.shm_server import ShmServer
from labdist.parameter_server.sync import SyncReplicas
from labdist.shm import area

MEAN, SUM = VariableAggregation.MEAN, VariableAggregation.SUM


def test_settings_pickle_and_answer_by_name():
    settings = PsSettings(mode="sync", use_locking=True, chunk_size=512,
                          replicas_to_aggregate=2, staleness_bound=None, ps_timeout=30.0,
                          transport="tcp", compression=FP16())
    back = pickle.loads(pickle.dumps(settings, protocol=5))
    assert back == settings and back.sync and not back.bounded
    bounded = PsSettings("async", False, 64, None, 3, 60.0)
    assert not bounded.sync and bounded.bounded and bounded.transport == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.mode = "async"  # type: ignore[misc]


def test_a_push_carries_the_aggregation_member_not_its_name():
    push = Push(3, "gradient", np.ones(4, np.float32), MEAN)
    back = pickle.loads(pickle.dumps(push, protocol=5))
    assert back.aggregation is MEAN and back.var_id == 3 and back.kind == "gradient"
    np.testing.assert_array_equal(back.value, push.value)
    moved = push.carrying("elsewhere")
    assert (moved.var_id, moved.kind, moved.value, moved.aggregation) == (
        3, "gradient", "elsewhere", MEAN)
    with pytest.raises(TypeError, match="VariableAggregation"):
        Push(3, "gradient", np.ones(4), "MEAN")  # type: ignore[arg-type]


def test_a_sync_step_hands_the_store_each_variables_aggregation():
    replicas = SyncReplicas(2)
    replicas.offer(("b",), 1, None, [Push(7, "assign_add", np.full(2, 2.0), SUM)], 3.0)
    replicas.offer(("a",), 0, None, [Push(7, "assign_add", np.full(2, 1.0), SUM)], 1.0)
    got = []

    async def update(batch):
        got.extend(batch)

    asyncio.run(replicas.apply(update))
    [step] = got
    assert (step.var_id, step.kind, step.aggregation, step.examples) == (
        7, "assign_add", SUM, [1.0, 3.0])  # in key order
    np.testing.assert_array_equal(np.stack(step.values), [[1.0, 1.0], [2.0, 2.0]])


class _Store:
    """What ShmServer asks of a ParameterStore for a push; keeps what arrived."""

    index = 99

    def __init__(self, sync: bool):
        self.sync = object() if sync else None
        self.got: list[tuple[Push, bool]] = []  # (push with its value copied, writeable)

    def _take(self, items: list[Push]) -> dict:
        for p in items:
            writeable = p.value.flags.writeable if isinstance(p.value, np.ndarray) else None
            value = p.value.copy() if isinstance(p.value, np.ndarray) else p.value
            self.got.append((p.carrying(value), writeable))
        return {"status": "applied", "global_step": 1, "values": None}

    def push_now(self, worker, items, basis, key, want):
        return self._take(items)

    async def push(self, worker, items, basis, step, key, want, examples):
        return self._take(items)


@pytest.mark.skipif(not area.available(), reason="no /dev/shm to share")
@pytest.mark.parametrize("sync", [False, True])
def test_a_push_crosses_the_same_host_path_as_it_was_sent(sync):
    store = _Store(sync)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ShmServer.start(store, loop)
    assert server is not None

    def dask_calls(calls):
        assert [m for _, m, _ in calls] == ["shm_probe"], calls  # nothing else over Dask
        return [server.probe]

    def probe(shard):
        done = concurrent.futures.Future()
        done.set_result({})
        return done

    paths = ShmPaths(0, True, dask_calls, probe)
    strided = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]  # any layout is copied in
    packed = Packed(FP16(), np.ones(3, np.float16), (3,), np.dtype(np.float32).str)
    sent = [Push(1, "assign_add", strided, SUM),
            Push(2, "gradient", packed, MEAN),  # compressed: travels in the message
            Push(3, "assign", np.float32(2.5) * np.ones((2, 2), np.float32),
                 VariableAggregation.ONLY_FIRST_REPLICA)]
    try:
        [reply] = paths.call_all([(0, "push", (5, sent, {1: 0}, None, ("k",), False, 1.0))],
                                 timeout=10.0)
        assert reply == {"status": "applied", "global_step": 1, "values": None}
        assert paths.paths() == {0: "shm"}
    finally:
        paths.close()
        server.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    got = [p for p, _ in store.got]
    assert [(p.var_id, p.kind, p.aggregation) for p in got] == [
        (p.var_id, p.kind, p.aggregation) for p in sent]
    assert all(p.aggregation is s.aggregation for p, s in zip(got, sent, strict=True))
    np.testing.assert_array_equal(got[0].value, strided)
    assert isinstance(got[1].value, Packed) and got[1].value.compressor == packed.compressor
    np.testing.assert_array_equal(got[1].value.decode(), packed.decode())
    np.testing.assert_array_equal(got[2].value, sent[2].value)
    assert got[2].value.dtype == np.float32
    # async mode reads the area in place (read-only); a sync step keeps copies past the reply
    assert [w for _, w in store.got] == [sync, None, sync]
