"""Paths given on the command line, checked before any work starts: a bad one is one line
naming the option, the path and why, not a traceback after a run."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from labdist.cli.mistakes import UserError


def user_path(option: str, text: str) -> Path:
    """`text` with `~` expanded; a `~user` that does not exist is the user's mistake, and so
    is an empty path (it would quietly mean the current folder)."""
    if not text.strip():
        raise UserError(f"{option} {text!r} is not allowed; use a path (e.g. {option} ./out)")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        raise UserError(f"{option} {text!r}: no such user's home folder") from None


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


@contextlib.contextmanager
def output_folder(option: str, text: str) -> Iterator[Path]:
    """The folder `text`, made and proved writable before the block runs (a probe file is
    written and removed). Folders made here are removed again when the block fails, so a
    failed run leaves nothing half-written behind."""
    folder = user_path(option, text)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{option} {text!r} exists and is not a folder")
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    ancestor = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if ancestor is not None and not ancestor.is_dir():
        raise UserError(f"{option} {text!r}: {str(ancestor)!r} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        _remove(missing)
        raise UserError(f"{option} {text!r} is not a writable folder ({_reason(e)})") from None
    try:
        yield folder
    except BaseException:
        _remove(missing)
        raise


def _remove(made: list[Path]) -> None:
    if made:
        shutil.rmtree(made[-1], ignore_errors=True)  # the outermost folder this run made


def write_atomically(path: Path, write) -> Path:
    """Call `write(temporary_path)`, then move the file to `path`: a reader (or a failure
    half-way) never sees a half-written file under the real name."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-",
                                         suffix=path.suffix)
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
