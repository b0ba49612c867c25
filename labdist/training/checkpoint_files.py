"""The files of a checkpoint, read without trusting them: index names stay inside their
directory, `.npz` members are described from their npy headers before any data is read, and
writes go through a temp file and a rename so a crash never leaves half a file."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import IO

import numpy as np

from labdist.errors import SaveError

INDEX = "checkpoint"
TEMP_SUFFIX = ".tmp"
_INDEX_MAX_BYTES = 4096
_NPY_VERSIONS = {(1, 0): np.lib.format.read_array_header_1_0,
                 (2, 0): np.lib.format.read_array_header_2_0}


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored (corrupt, truncated, hostile, or another model's);
    the message names the file and what is wrong. Nothing was changed."""


def temp_pattern(names: str) -> re.Pattern:
    """The names `atomic_write` gives its temp files for targets matching regex `names`."""
    return re.compile(rf"\.(?:{names})\.[a-z0-9_]+{re.escape(TEMP_SUFFIX)}")


def atomic_write(target: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write `target` through a temp file (`.<name>.<random>.tmp`, next to it) and a rename:
    a crash leaves the old file or the new one, never half of one."""
    atomic_write_all([(target, write)])


def atomic_write_all(files: list[tuple[Path, Callable[[IO[bytes]], object]]]) -> None:
    """Write every target to a temp file first, and rename them into place only once all are
    written, so a failure leaves none of them changed. A target that is a directory is
    refused before anything is written."""
    for target, _write in files:
        if target.is_dir():
            raise IsADirectoryError(21, "a folder is where this file should go", str(target))
    temps: list[str] = []
    try:
        for target, write in files:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                       suffix=TEMP_SUFFIX)
            temps.append(tmp)
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        for tmp, (target, _write) in zip(temps, files, strict=True):
            os.replace(tmp, target)
    except BaseException:
        for tmp in temps:
            Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def writing(call: str, path: Path) -> Iterator[None]:
    """Turn an OSError while saving into one `SaveError` naming the call, the path and why."""
    try:
        yield
    except SaveError:
        raise
    except OSError as e:
        where = e.filename if e.filename is not None else path
        raise SaveError(f"{call}: cannot write {str(where)!r} ({e.strerror or e}); allowed: a "
                        "path in a folder you can write to, with no file or folder in the way"
                        ) from None


def inside(directory: Path, name: str, what: str) -> Path:
    """`directory / name` if it names a regular file inside `directory` (symlinks resolved);
    refuses absolute names, `..` and links that lead out, so an index cannot read elsewhere."""
    pure = PurePath(name)
    if not name or "\x00" in name or pure.is_absolute() or ".." in pure.parts:
        raise CheckpointError(f"{what} names {name!r}: only a file name inside "
                              f"{str(directory)!r} is allowed (no absolute path, no '..')")
    root = directory.resolve()
    path = (directory / pure).resolve()
    if not path.is_relative_to(root) or path == root:
        raise CheckpointError(f"{what} names {name!r}, which resolves to {str(path)!r}, "
                              f"outside the checkpoint directory {str(root)!r}")
    if not path.is_file():
        raise CheckpointError(f"{what} names {name!r}, but {str(directory / pure)!r} is "
                              "missing or not a regular file")
    return directory / pure


def read_index(directory: Path) -> Path:
    """The checkpoint file the index of `directory` names (checked by `inside`)."""
    index = directory / INDEX
    if not index.exists() and not index.is_symlink():
        raise FileNotFoundError(f"no checkpoint in {str(directory)!r} (no {INDEX!r} index)")
    root, target = directory.resolve(), index.resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise CheckpointError(f"index {str(index)!r} resolves to {str(target)!r}: outside "
                              f"the checkpoint directory {str(root)!r}, or not a regular file")
    with open(index, "rb") as f:
        raw = f.read(_INDEX_MAX_BYTES + 1)
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        name = None
    if name is None or len(raw) > _INDEX_MAX_BYTES or "\n" in name:
        raise CheckpointError(f"index {str(index)!r} is not a checkpoint index (one file name "
                              f"of at most {_INDEX_MAX_BYTES} bytes, UTF-8)")
    return inside(directory, name, f"index {str(index)!r}")


def read_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array of the `.npz` at `path`: (shape, dtype) from its npy header, no data read.
    Refuses anything `np.load(allow_pickle=False)` could not read in full."""
    headers: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                key = _key(path, info.filename)
                if key in headers:
                    raise CheckpointError(f"checkpoint {str(path)!r}: array {key!r} is stored "
                                          "twice")
                with zf.open(info) as f:
                    headers[key] = _header(path, key, f, info.file_size)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as e:
        if isinstance(e, CheckpointError | FileNotFoundError):
            raise
        raise CheckpointError(f"checkpoint {str(path)!r} is not a readable .npz "
                              f"({type(e).__name__}: {e})") from e
    return headers


def read_arrays(path: Path, keys: list[str]) -> dict[str, np.ndarray]:
    """The arrays `keys` of the `.npz` at `path` (headers already checked by the caller)."""
    out: dict[str, np.ndarray] = {}
    key = None
    try:
        with zipfile.ZipFile(path) as zf:
            for key in keys:
                with zf.open(f"{key}.npy") as f:
                    out[key] = np.lib.format.read_array(f, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: array {key!r} cannot be read "
                              f"({type(e).__name__}: {e})") from e
    return out


def _key(path: Path, member: str) -> str:
    if not member.endswith(".npy"):
        raise CheckpointError(f"checkpoint {str(path)!r}: member {member!r} is not an .npy "
                              "array")
    return member[:-4]


def _header(path: Path, key: str, f: IO[bytes], size: int):
    """(shape, dtype) of one npy member; its stored size must be exactly what they claim."""
    where = f"checkpoint {str(path)!r}: array {key!r}"
    try:
        version = np.lib.format.read_magic(f)
    except ValueError as e:
        raise CheckpointError(f"{where} is not an npy array ({e})") from None
    if version not in _NPY_VERSIONS:
        raise CheckpointError(f"{where} has npy format version {version}; allowed: "
                              f"{sorted(_NPY_VERSIONS)}")
    try:
        shape, _fortran, dtype = _NPY_VERSIONS[version](f)
    except ValueError as e:
        raise CheckpointError(f"{where} has a malformed npy header ({e})") from None
    if dtype.hasobject:
        raise CheckpointError(f"{where} holds Python objects (dtype {dtype}); a checkpoint "
                              "holds numbers only and is read without pickle")
    count = int(np.prod(shape, dtype=object))
    if size != f.tell() + count * dtype.itemsize:
        raise CheckpointError(f"{where}: its header claims shape {shape} of {dtype}, "
                              f"{count * dtype.itemsize} bytes, but the member holds "
                              f"{size - f.tell()}")
    return tuple(shape), dtype
