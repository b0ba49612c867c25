"""Checkpoints that cannot be trusted: corrupt, truncated and hostile files are refused with an
error naming the file and the fault, before anything changes (every weight and optimizer slot
compared bit for bit); a failing assignment is rolled back. Saving touches no other file."""

from __future__ import annotations

import io
import os
import signal
import struct
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

import labdist as ld
from labdist.variables import Variable

CheckpointError = ld.train.CheckpointError


def small_model(seed: int, strategy=None, trained: int = 1) -> ld.models.Sequential:
    """A two-layer model with Adam state (trained `trained` epochs, so the slots are not 0)."""
    strategy = strategy or ld.get_strategy()
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(8, activation="relu", input_shape=(4,)),
            ld.layers.Dense(3, activation="softmax")], seed=seed)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam())
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), np.arange(64) % 3
    for _ in range(trained):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return model


def state_of(model) -> dict[str, object]:
    """Every copy of every weight and optimizer slot on every replica, and the step count."""
    state: dict[str, object] = {"iterations": model._iterations}
    variables = ld.train.Checkpoint(model=model)._variables()
    for key, v in variables.items():
        state[key] = [(c.dtype.str, c.shape, c.tobytes())
                      for c in model._strategy.experimental_local_results(v)]
    return state


def good_arrays(seed: int = 5) -> dict[str, np.ndarray]:
    """A valid checkpoint's arrays, from another model (so a restore would change values)."""
    return ld.train.Checkpoint(model=small_model(seed, trained=2))._arrays()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def with_index(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "checkpoint").write_text(name)
    return directory


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def huge_header_member(shape: tuple[int, ...]) -> bytes:
    """An npy member whose header claims `shape` (float64) but which holds 16 bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 16


def forge_size(path: Path, member: str, size: int) -> None:
    """Rewrite the sizes the zip records for `member` (local and central headers) to `size`,
    so its header's claim and the zip's agree while the data is not there."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_len] == member.encode():
            struct.pack_into("<II", data, at + 20, size, size)
            local = struct.unpack_from("<I", data, at + 42)[0]
            struct.pack_into("<II", data, local + 18, size, size)
        at = data.find(b"PK\x01\x02", at + 1)
    path.write_bytes(bytes(data))


def zip_members(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


# -- each maker returns (what to restore, the file the error must name, what it must say) ---
def not_a_zip(d: Path):
    (d / "ckpt-1.npz").parent.mkdir(parents=True)
    (d / "ckpt-1.npz").write_bytes(b"this is no zip file at all" * 10)
    return with_index(d, "ckpt-1.npz"), d / "ckpt-1.npz", "not a readable .npz"


def garbage_member(d: Path):
    members = {f"{k}.npy": npy_bytes(a) for k, a in good_arrays().items()}
    members["weight/dense_0/kernel.npy"] = os.urandom(200)
    path = zip_members(d / "ckpt-1.npz", members)
    return with_index(d, path.name), path, "weight/dense_0/kernel' is not an npy array"


def truncated(d: Path):
    path = write_npz(d / "ckpt-1.npz", good_arrays())
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return with_index(d, path.name), path, "not a readable .npz"


def index_to_parent(d: Path):
    write_npz(d.parent / "x.npz", good_arrays())  # a valid checkpoint, outside the directory
    return with_index(d, "../x.npz"), d / "checkpoint", "no '..'"


def index_absolute(d: Path):
    outside = write_npz(d.parent / "elsewhere" / "x.npz", good_arrays())
    return with_index(d, str(outside)), d / "checkpoint", "no absolute path"


def symlink_out(d: Path):
    outside = write_npz(d.parent / "elsewhere" / "x.npz", good_arrays())
    d.mkdir()
    (d / "ckpt-1.npz").symlink_to(outside)
    return with_index(d, "ckpt-1.npz"), d / "checkpoint", "outside the checkpoint directory"


def index_symlink_out(d: Path):
    write_npz(d / "ckpt-1.npz", good_arrays())
    (d.parent / "index-elsewhere").write_text("ckpt-1.npz")
    (d / "checkpoint").symlink_to(d.parent / "index-elsewhere")
    return d, d / "checkpoint", "outside the checkpoint directory"


def index_garbage(d: Path):
    d.mkdir()
    (d / "checkpoint").write_bytes(b"\xff\xfe" + os.urandom(64))
    return d, d / "checkpoint", "is not a checkpoint index"


def huge_shape(d: Path):
    members = {f"{k}.npy": npy_bytes(a) for k, a in good_arrays().items()}
    members["weight/dense_0/kernel.npy"] = huge_header_member((1 << 20, 1 << 20))
    path = zip_members(d / "ckpt-1.npz", members)
    return with_index(d, path.name), path, "claims shape (1048576, 1048576)"


def huge_shape_extra(d: Path):
    members = {f"{k}.npy": npy_bytes(a) for k, a in good_arrays().items()}
    members["weight/huge.npy"] = huge_header_member((1 << 40,))
    path = zip_members(d / "ckpt-1.npz", members)
    return with_index(d, path.name), path, "claims shape (1099511627776,)"


def huge_shape_forged_zip(d: Path):
    """The header claims 960 MB and so does the zip: the model's shape refuses it unread."""
    members = {f"{k}.npy": npy_bytes(a) for k, a in good_arrays().items()}
    members["weight/dense_0/kernel.npy"] = huge_header_member((30000, 4000))
    path = zip_members(d / "ckpt-1.npz", members)
    header = len(huge_header_member((30000, 4000))) - 16
    forge_size(path, "weight/dense_0/kernel.npy", header + 30000 * 4000 * 8)
    says = "weight/dense_0/kernel has shape (30000, 4000), the model has (4, 8)"
    return with_index(d, path.name), path, says


def changed(direct: bool = False, **edits):
    """A checkpoint of good arrays with `edits` (key: function of the old array, or None to
    drop it; `__` stands for `/`), restored by its directory, or by its path if `direct`."""
    def make(d: Path):
        arrays = good_arrays()
        for key, value in edits.items():
            key = key.replace("__", "/")
            if value is None:
                arrays.pop(key)
            else:
                arrays[key] = value(arrays.get(key))
        path = write_npz(d / "ckpt-1.npz", arrays)
        return (path if direct else with_index(d, path.name)), path, None
    return make


HOSTILE = {
    "not a zip": not_a_zip,
    "zip with a garbage member": garbage_member,
    "truncated in the middle": truncated,
    "index points at ../x.npz": index_to_parent,
    "index is an absolute path": index_absolute,
    "symlink out of the directory": symlink_out,
    "index is binary garbage": index_garbage,
    "index is a symlink out of the directory": index_symlink_out,
    "member header claims a huge shape": huge_shape,
    "extra member claims a huge shape": huge_shape_extra,
    "huge shape, and the zip agrees": huge_shape_forged_zip,
}
CHANGED = {  # the edit, and what the error must say
    "wrong dtype (int64 into float32)": (
        changed(weight__dense_1__bias=lambda a: a.astype(np.int64)),
        "weight/dense_1/bias is int64, which does not restore into the model's float32"),
    "wrong dtype (float64 into float32)": (
        changed(direct=True, slot__dense_1__bias__v=lambda a: a.astype(np.float64)),
        "slot/dense_1/bias/v is float64"),
    "wrong shape": (changed(weight__dense_0__bias=lambda a: np.zeros(9, np.float32)),
                    "weight/dense_0/bias has shape (9,), the model has (8,)"),
    "a missing array": (changed(slot__dense_0__kernel__m=None),
                        "missing ['slot/dense_0/kernel/m'], unexpected []"),
    "an extra array": (changed(weight__dense_2__kernel=lambda a: np.zeros(3, np.float32)),
                       "missing [], unexpected ['weight/dense_2/kernel']"),
    "missing meta/iterations": (changed(meta__iterations=None), "has no 'meta/iterations'"),
    "missing meta/format": (changed(meta__format=None), "has no 'meta/format'"),
    "meta/iterations not a scalar": (changed(meta__iterations=lambda a: np.array([3, 4])),
                                     "'meta/iterations' is int64 of shape (2,)"),
    "negative meta/iterations": (changed(meta__iterations=lambda a: np.array(-1)),
                                 "meta/iterations is -1"),
    "wrong format version": (changed(direct=True, meta__format=lambda a: np.array(2)),
                             "has format 2; this labdist reads format 1"),
}


def check_refused(model, tmp_path: Path, make, says: str | None = None) -> CheckpointError:
    before = state_of(model)
    target, named, message = make(tmp_path / "ckpt")
    with pytest.raises(CheckpointError) as info:
        ld.train.Checkpoint(model=model).restore(target)
    text = str(info.value)
    assert str(named) in text, text
    assert (says or message) in text, text
    assert state_of(model) == before  # bit for bit, every copy, and the step count
    return info.value


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_corrupt_and_hostile_checkpoints_are_refused_and_change_nothing(case, tmp_path):
    check_refused(small_model(1), tmp_path, HOSTILE[case])


@pytest.mark.parametrize("case", sorted(CHANGED))
def test_checkpoints_that_do_not_match_the_model_are_refused_and_change_nothing(case, tmp_path):
    make, says = CHANGED[case]
    check_refused(small_model(1), tmp_path, make, says)


@pytest.mark.parametrize("make", [huge_shape, huge_shape_forged_zip])
def test_a_huge_claimed_shape_is_refused_before_allocating(make, tmp_path):
    model = small_model(1)
    tracemalloc.start()
    try:
        check_refused(model, tmp_path, make)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the claims are 8 TiB and 960 MB; only headers were read


@pytest.mark.timeout(120)
def test_refused_checkpoints_leave_a_mirrored_model_exactly_as_it_was(mirrored2, tmp_path):
    """Two worker processes: every replica's copy of every weight and slot is unchanged."""
    model = small_model(1, strategy=mirrored2)
    for i, case in enumerate(["wrong dtype (int64 into float32)", "missing meta/iterations",
                              "wrong format version"]):
        make, says = CHANGED[case]
        check_refused(model, tmp_path / str(i), make, says)
    check_refused(model, tmp_path / "t", truncated)


def test_a_safe_dtype_restores_exactly(tmp_path):
    """The documented rule: a stored dtype numpy casts "safe"ly to the variable's restores."""
    arrays = good_arrays()
    arrays["weight/dense_0/bias"] = arrays["weight/dense_0/bias"].astype(np.float16)
    write_npz(tmp_path / "ckpt-9.npz", arrays)
    model = small_model(1)
    ld.train.Checkpoint(model=model).restore(with_index(tmp_path, "ckpt-9.npz"))
    np.testing.assert_array_equal(model._weights[0]["bias"].numpy(),
                                  arrays["weight/dense_0/bias"].astype(np.float32))
    np.testing.assert_array_equal(model._weights[1]["kernel"].numpy(),
                                  arrays["weight/dense_1/kernel"])
    assert model._iterations == int(arrays["meta/iterations"])


def failing_assign(monkeypatch, fail_on, forever: bool = False):
    """Make `Variable.assign` raise for the variable named `fail_on` (once, or every time)."""
    real = Variable.assign
    calls = []

    def assign(self, value, read_value=True):
        if self.name == fail_on and (forever or not calls):
            calls.append(self.name)
            raise ld.ReplicaLostError(f"simulated: the worker holding {self.name} was lost")
        return real(self, value, read_value)

    monkeypatch.setattr(Variable, "assign", assign)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["default", "mirrored2"])
def test_an_assignment_failing_midway_is_rolled_back(where, request, monkeypatch, tmp_path):
    strategy = request.getfixturevalue("mirrored2") if where == "mirrored2" else None
    model = small_model(1, strategy=strategy)
    other = small_model(5, strategy=strategy, trained=2)
    ld.train.Checkpoint(model=other).save(tmp_path)
    before = state_of(model)
    failing_assign(monkeypatch, "dense_1/kernel/m")  # a slot: every weight was assigned first
    with pytest.raises(ld.ReplicaLostError, match="simulated"):
        ld.train.Checkpoint(model=model).restore(tmp_path)
    assert state_of(model) == before
    monkeypatch.undo()
    ld.train.Checkpoint(model=model).restore(tmp_path)  # and the checkpoint itself is fine
    assert state_of(model) == state_of(other)


def test_a_rollback_that_fails_says_what_it_could_not_undo(monkeypatch, tmp_path):
    model = small_model(1)
    ld.train.Checkpoint(model=small_model(5, trained=2)).save(tmp_path)
    failing_assign(monkeypatch, "dense_1/bias", forever=True)
    with pytest.raises(CheckpointError, match=r"rolling back failed for \['weight/dense_1/bias"
                                              r"'\].*strategy.recover\(\)") as info:
        ld.train.Checkpoint(model=model).restore(tmp_path)
    assert isinstance(info.value.__cause__, ld.ReplicaLostError)


def test_save_into_a_shared_directory_touches_no_other_file(monkeypatch, tmp_path):
    mine = {"notes.txt": b"mine", "ckpt-notes.npz": b"also mine", ".ckpt-1.npz.keep": b"x"}
    for name, data in mine.items():
        (tmp_path / name).write_bytes(data)
    model = small_model(1)
    first = ld.train.Checkpoint(model=model).save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {*mine, "checkpoint", Path(first).name}

    def broken_savez(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(np, "savez", broken_savez)
    model._iterations += 1
    with pytest.raises(OSError, match="disk full"):
        ld.train.Checkpoint(model=model).save(tmp_path)  # no temp file left, index unchanged
    assert {p.name for p in tmp_path.iterdir()} == {*mine, "checkpoint", Path(first).name}
    assert (tmp_path / "checkpoint").read_text() == Path(first).name
    assert all((tmp_path / n).read_bytes() == data for n, data in mine.items())


@pytest.mark.timeout(180)
def test_a_worker_killed_mid_restore_is_named_and_recover_then_restore_makes_it_whole(
        monkeypatch, tmp_path):
    """A real SIGKILL between two assignments: the rollback cannot reach the lost replica, so
    the error says what it could not undo; recover() and a second restore make it whole."""
    with ld.MirroredStrategy(num_replicas=2, collective_timeout=20) as strategy:
        model = small_model(1, strategy=strategy)
        source = small_model(5, trained=2)
        ld.train.Checkpoint(model=source).save(tmp_path)
        pid = strategy.experimental_local_results(strategy.run(os.getpid))[1]
        real = Variable.assign

        def assign(self, value, read_value=True):
            if self.name == "dense_1/kernel" and os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.5)
            return real(self, value, read_value)

        monkeypatch.setattr(Variable, "assign", assign)
        with pytest.raises(CheckpointError, match=r"failed at weight/dense_1/kernel .*rolling "
                                                  r"back failed for \[") as info:
            ld.train.Checkpoint(model=model).restore(tmp_path)
        assert isinstance(info.value.__cause__, ld.ReplicaLostError)
        monkeypatch.undo()
        assert strategy.recover()
        ld.train.Checkpoint(model=model).restore(tmp_path)
        want = state_of(source)
        got = state_of(model)
        assert got["iterations"] == want["iterations"]
        for key in want:
            if key != "iterations":
                assert all(copy == want[key][0] for copy in got[key]), key


# -- BackupAndRestore ------------------------------------------------------------------------
def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(64, 4)).astype(np.float32), np.arange(64) % 3


class Watch(ld.callbacks.Callback):
    """Records the backup directory's file names at the start of fit and after each epoch."""

    def __init__(self, directory: Path, stop_after: int | None = None):
        self.directory, self.stop_after, self.seen = directory, stop_after, []

    def _look(self):
        d = self.directory
        self.seen.append(sorted(p.name for p in d.iterdir()) if d.exists() else None)

    def on_train_begin(self, logs=None):
        self._look()

    def on_epoch_end(self, epoch, logs=None):
        self._look()
        if epoch == self.stop_after:
            raise KeyboardInterrupt("interrupted (simulated)")


USER_FILES = {"notes.txt": b"mine", "ckpt-notes.npz": b"mine too", "my-ckpt-3.npz": b"3",
              ".ckpt-12.npz.abcd1234.tmp.keep": b"k", ".ckpt-12.npz.mine.bak": b"b",
              ".epoch.backup": b"e"}


def user_dir(directory: Path) -> Path:
    directory.mkdir()
    for name, content in USER_FILES.items():
        (directory / name).write_bytes(content)
    return directory


def user_files_intact(directory: Path) -> bool:
    return all((directory / n).read_bytes() == c for n, c in USER_FILES.items())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["default", "mirrored2"])
def test_backup_keeps_max_to_keep_and_a_completed_fit_removes_only_its_own(
        where, request, tmp_path):
    strategy = request.getfixturevalue("mirrored2") if where == "mirrored2" else None
    backup_dir = user_dir(tmp_path / "backup")
    model, (x, y) = small_model(1, strategy=strategy, trained=0), data()
    watch = Watch(backup_dir)
    backup = ld.callbacks.BackupAndRestore(backup_dir, max_to_keep=2)
    model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[backup, watch])
    for epoch, names in enumerate(watch.seen[1:]):  # 4 steps an epoch
        ckpts = [f"ckpt-{4 * e}.npz" for e in range(max(1, epoch), epoch + 2)]
        assert names == sorted([*USER_FILES, "checkpoint", "epoch", *ckpts]), epoch
    assert sorted(p.name for p in backup_dir.iterdir()) == sorted(USER_FILES)  # the dir stays
    assert user_files_intact(backup_dir)


def test_backup_removes_its_stale_temp_files_on_start_and_nothing_like_them(tmp_path):
    backup_dir = user_dir(tmp_path / "backup")
    stale = [".ckpt-12.npz.abcd1234.tmp", ".epoch.x1y2z3q4.tmp", ".checkpoint.k9_2mmq0.tmp"]
    for name in stale:
        (backup_dir / name).write_bytes(b"half a file")
    model, (x, y) = small_model(1, trained=0), data()
    watch = Watch(backup_dir)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[ld.callbacks.BackupAndRestore(backup_dir), watch])
    assert watch.seen[0] == sorted(USER_FILES)  # at the start: the stale ones gone, not more
    assert user_files_intact(backup_dir)


def test_an_interrupted_fit_resumes_from_the_kept_backup(tmp_path):
    backup_dir = tmp_path / "made" / "backup"
    model, (x, y) = small_model(1, trained=0), data()
    backup = ld.callbacks.BackupAndRestore(str(backup_dir), max_to_keep=1)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=5, verbose=0,
                  callbacks=[backup, Watch(backup_dir, stop_after=2)])
    assert sorted(p.name for p in backup_dir.iterdir()) == ["checkpoint", "ckpt-12.npz", "epoch"]
    saved = state_of(model)
    fresh = small_model(7, trained=0)
    watch = Watch(backup_dir)
    history = fresh.fit(x, y, batch_size=16, epochs=5, verbose=0, callbacks=[backup, watch])
    assert history.epoch == [3, 4]
    assert fresh._iterations == 20
    assert watch.seen[0] == ["checkpoint", "ckpt-12.npz", "epoch"]
    assert not backup_dir.exists()  # it made the directory, and it is empty: removed
    assert backup_dir.parent.is_dir()  # only the directory named backup_dir is its own
    assert state_of(model) == saved  # (the first model untouched by the second fit)


def test_backup_never_overwrites_or_deletes_what_it_did_not_write(tmp_path):
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    (backup_dir / "ckpt-4.npz").write_bytes(b"the user's own file of that name")
    model, (x, y) = small_model(1, trained=0), data()
    with pytest.raises(CheckpointError, match="holds 'ckpt-4.npz', which BackupAndRestore "
                                              "did not write"):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                  callbacks=[ld.callbacks.BackupAndRestore(backup_dir)])
    assert (backup_dir / "ckpt-4.npz").read_bytes() == b"the user's own file of that name"

    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoint").write_text("a user's index")
    with pytest.raises(CheckpointError, match="holds a 'checkpoint' file that BackupAndRestore "
                                              "did not write"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[ld.callbacks.BackupAndRestore(other)])
    assert (other / "checkpoint").read_text() == "a user's index"


@pytest.mark.parametrize("state", [
    b'{"epoch": 1, "checkpoint": "../victim.npz", "checkpoints": ["../victim.npz"], '
    b'"made_dir": true}',
    b'{"epoch": 1, "checkpoint": null, "checkpoints": ["/tmp/victim.npz"], "made_dir": true}',
    b"\x00\xff not json"])
def test_a_hostile_backup_state_deletes_and_restores_nothing(state, tmp_path):
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    (backup_dir / "epoch").write_bytes(state)
    victim = write_npz(tmp_path / "victim.npz", good_arrays())
    model, (x, y) = small_model(1), data()
    before = state_of(model)
    with pytest.raises(CheckpointError, match=r"BackupAndRestore state '.*epoch'"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[ld.callbacks.BackupAndRestore(backup_dir)])
    assert victim.exists() and (backup_dir / "epoch").read_bytes() == state
    assert state_of(model) == before


@pytest.mark.parametrize("case", ["truncated in the middle", "wrong format version"])
def test_a_damaged_backup_is_refused_and_the_model_is_unchanged(case, tmp_path):
    backup_dir = tmp_path / "backup"
    model, (x, y) = small_model(1, trained=0), data()
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=3, verbose=0,
                  callbacks=[ld.callbacks.BackupAndRestore(backup_dir),
                             Watch(backup_dir, stop_after=0)])
    path = backup_dir / "ckpt-4.npz"
    if case == "truncated in the middle":
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    else:
        arrays = dict(np.load(path))
        write_npz(path, arrays | {"meta/format": np.array(2)})
    before = state_of(model)
    with pytest.raises(CheckpointError, match=str(path)):
        model.fit(x, y, batch_size=16, epochs=3, verbose=0,
                  callbacks=[ld.callbacks.BackupAndRestore(backup_dir)])
    assert state_of(model) == before
    assert path.exists()  # the evidence stays


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"max_to_keep": 0}, ValueError, r"max_to_keep=0 is not allowed; use an integer >= 1 \(how"),
    ({"max_to_keep": True}, ValueError, "max_to_keep=True"),
    ({"max_to_keep": "2"}, ValueError, "max_to_keep='2'"),
    ({"backup_dir": ""}, TypeError, "backup_dir='' must be a non-empty path"),
    ({"backup_dir": 3}, TypeError, "backup_dir=3"),
])
def test_backup_arguments_are_checked(kwargs, error, says):
    with pytest.raises(error, match=says):
        ld.callbacks.BackupAndRestore(**({"backup_dir": "b"} | kwargs))


def test_a_directory_it_made_stays_when_someone_else_put_a_file_in_it(tmp_path):
    backup_dir = tmp_path / "backup"

    class Drop(ld.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            (backup_dir / "plot.png").write_bytes(b"png")

    model, (x, y) = small_model(1, trained=0), data()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[ld.callbacks.BackupAndRestore(backup_dir), Drop()])
    assert sorted(p.name for p in backup_dir.iterdir()) == ["plot.png"]


def test_a_backup_of_the_earlier_version_still_resumes(tmp_path):
    """Its state file held the epoch alone, and the index named the checkpoint."""
    backup_dir = tmp_path / "backup"
    source = small_model(5, trained=2)  # 8 steps
    ld.train.Checkpoint(model=source).save(backup_dir)
    (backup_dir / "epoch").write_text("1")
    model, (x, y) = small_model(1, trained=0), data()
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0,
                        callbacks=[ld.callbacks.BackupAndRestore(backup_dir)])
    assert history.epoch == [2] and model._iterations == 12
    assert not any(backup_dir.iterdir())  # its files gone; the directory predates it: stays
