"""The shared-memory transport on the machines users have: a small /dev/shm (Docker's 64 MiB),
files planted under its names, areas that must not keep an outsized collective's memory."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import labdist as ld
from labdist.collectives.transports import shm
from labdist.collectives.transports.protocol import Endpoint
from labdist.shm import area as shm_area

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")

HERE = Path(__file__).resolve().parents[1]  # tests/, where the helper scripts live
TMPFS_MIB = 32


def _unshare_reason() -> str | None:
    """Why a private 32 MiB /dev/shm cannot be mounted here, or None if it can."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs "
                            "/dev/shm"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot mount a private /dev/shm (needs root): {probe.stderr.strip()}"
    return None


@pytest.mark.timeout(240)
def test_a_small_dev_shm_falls_back_to_dask_comms_and_stays_usable():
    """46 MiB all-reduces on a 32 MiB /dev/shm used to kill both workers with SIGBUS (areas
    were only truncated to size). Now each message that does not fit goes over Dask comms,
    with a warning naming /dev/shm, and later collectives take shared memory again."""
    reason = _unshare_reason()
    if reason:
        pytest.skip(reason)
    script = f"mount -t tmpfs -o size={TMPFS_MIB}m tmpfs /dev/shm && exec \"$0\" \"$@\""
    # mixed: 20 MiB reduce-scatter halves (a 20 MiB area each): room for one replica's only;
    # big: 46 MiB (46 MiB areas): room for neither
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, sys.executable, str(HERE / "shm_small_driver.py"),
         "20", "46"],
        capture_output=True, text=True, timeout=200, env={**os.environ, "PYTHONPATH": path})
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["transport"] == "shm"
    for name in ("small", "mixed", "big", "after", "again"):
        assert "error" not in out[name], (name, out[name])
        assert out[name]["values"] == [3.0], (name, out[name])  # 1 + 2 everywhere
    assert out["big"]["sizes"] == [46 * 2**18] * 2
    assert out["alive"] == [True, True]
    told = out["mixed"]["warnings"] + out["big"]["warnings"]
    assert told and all("/dev/shm" in w and "MiB free" in w and "--shm-size" in w
                        and "transport='tcp'" in w for w in told), told
    assert not out["small"]["warnings"] and not out["after"]["warnings"]


def _ours(group: str) -> dict[str, int]:
    """This group's files in /dev/shm and their sizes."""
    found = {}
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"labdist-{group[:16]}-"):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                found[name] = os.stat(os.path.join("/dev/shm", name)).st_size
    return found


def _all_reduce(n: int):
    def fn():
        ctx = ld.get_replica_context()
        return ctx.all_reduce("SUM", ctx.xp.ones(n, dtype=np.float32))
    return fn


@pytest.mark.timeout(120)
def test_areas_shrink_after_an_outsized_collective():
    from conftest import make_strategy

    s = make_strategy("mirrored-2")
    s.run(_all_reduce(16 * 2**20))  # 64 MiB: 32 MiB halves, a 64 MiB area per replica
    assert max(_ours(s.group.group).values()) >= 64 * 2**20
    for _ in range(2 * shm.REVIEW_RUNS + 1):  # a review that saw only small collectives
        out = s.run(_all_reduce(1000))
    assert float(s.experimental_local_results(out)[0][0]) == 2.0
    sizes = _ours(s.group.group)
    assert max(sizes.values()) <= shm.KEEP_BYTES, sizes
    out = s.run(_all_reduce(600_000))  # areas grow again where needed
    assert float(s.experimental_local_results(out)[1][-1]) == 2.0


@pytest.mark.timeout(120)
def test_files_planted_under_the_next_names_do_not_fail_a_run():
    """The data files' names used to be predictable (…-<pid>-data<generation>): a file planted
    under the next one made the run fail with a raw FileExistsError."""
    from conftest import make_strategy

    s = make_strategy("mirrored-2")
    group = s.group.group[:16]
    planted = [f"/dev/shm/labdist-{group}-{rank}-{info['pid']}-data{gen}"
               for rank, info in enumerate(s.group.infos) for gen in range(1, 40)]
    try:
        for path in planted:
            with open(path, "x"):
                pass
        for n in (300_000, 3_000_000, 9_000_000):  # each grows the areas
            out = s.run(_all_reduce(n))
            assert {float(r[-1]) for r in s.experimental_local_results(out)} == {2.0}
    finally:
        for path in planted:
            if os.path.exists(path):
                os.unlink(path)


def test_a_name_taken_is_retried_under_another(monkeypatch, tmp_path):
    prefix = f"/dev/shm/labdist-test{os.getpid()}-0-{os.getpid()}"
    taken = shm_area.name(prefix, 1, "-control")
    open(taken, "x").close()
    made = None
    try:
        draws = iter([1, 2])
        monkeypatch.setattr(shm_area, "nonce", lambda: next(draws))
        made = shm_area.create(prefix, "-control", shm_area.CONTROL_BYTES)
        assert made.path == shm_area.name(prefix, 2, "-control") and made.nonce == 2
        monkeypatch.setattr(shm_area, "nonce", lambda: 1)
        with pytest.raises(FileExistsError, match=r"/dev/shm.*transport='tcp'"):
            shm_area.create(prefix, "-control", shm_area.CONTROL_BYTES)
    finally:
        os.unlink(taken)
        if made is not None:
            os.unlink(made.path)
            made.close()


class _QuietMailbox:
    """No peer news and no Dask messages: two in-process ranks over shared memory only."""

    _messages: dict = {}

    def _raise_if_gone(self, *args) -> None:
        pass


@pytest.mark.timeout(60)
def test_an_area_a_slow_peer_has_yet_to_open_is_not_removed_under_it():
    """Message 1 makes a new area, message 2 a larger one. A peer slow to read message 1 used
    to find its area already removed (FileNotFoundError): it is now removed only at the
    message after, when every peer has read it."""
    group = secrets.token_hex(8)
    ranks = [shm.ShmTransport(Endpoint(group, r, ["a", "b"], 5.0, mailbox=_QuietMailbox()))
             for r in range(2)]
    try:
        probes = [t.probe() for t in ranks]
        assert all(t.connect(probes) for t in ranks)
        slow = ranks[1]._receive

        def late(*args):  # rank 1 reads rank 0's message 1 late
            if args[2] & 0xFFFFFF == 1:
                time.sleep(0.5)
            return slow(*args)
        ranks[1]._receive = late
        sizes = [1000, 250_000, 1_000_000]  # float64: 8 KB, 2 MB, 8 MB: each grows the area
        got: dict[int, list] = {}

        def run(rank: int) -> None:
            t = ranks[rank]
            t.start_run(1)
            out = []
            for seq, n in enumerate(sizes, 1):
                mine = np.full(n, rank + 1.0)
                out.append([float(p[-1]) for _, p in t.exchange(seq, 0, None, mine, "x", False)])
            got[rank] = out
        threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert got == {0: [[1.0, 2.0]] * 3, 1: [[1.0, 2.0]] * 3}
    finally:
        for t in ranks:
            t.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"labdist-{group}")]
