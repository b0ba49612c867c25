"""Driver for tests/collectives/test_shm.py, run under a /dev/shm of a few MiB (its own mount
namespace): collectives that fit, one that fits one replica's area but not both, one that
fits neither, then a small one again. Prints one line, RESULT <json>."""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np

import labdist as ld


def step(n: int):
    def fn():
        ctx = ld.get_replica_context()
        return ctx.all_reduce("SUM", ctx.xp.full(n, ctx.replica_id_in_sync_group + 1.0,
                                                 dtype=np.float32))
    return fn


def attempt(s: ld.Strategy, n: int) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            results = s.experimental_local_results(s.run(step(n)))
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
    return {"values": sorted({float(v) for r in results for v in (r.min(), r.max())}),
            "sizes": [int(r.size) for r in results],
            "warnings": [str(w.message) for w in caught]}


def main() -> None:
    mib = 2**20 // 4  # float32 elements per MiB
    out: dict = {}
    with ld.MirroredStrategy(num_replicas=2, collective_timeout=60) as s:
        out["transport"] = s.transport
        for name, n in [("small", 1000), ("mixed", int(sys.argv[1]) * mib),
                        ("big", int(sys.argv[2]) * mib), ("after", 1000), ("again", 300_000)]:
            out[name] = attempt(s, n)
        alive = []
        for info in s.group.infos:
            try:
                os.kill(info["pid"], 0)
                alive.append(True)
            except ProcessLookupError:
                alive.append(False)
        out["alive"] = alive
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
