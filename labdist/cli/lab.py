"""`labdist lab`: JupyterLab on labdist's notebooks, opening the interactive lab."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from labdist.cli.mistakes import UserError
from labdist.cli.notebook_outputs import save_options
from labdist.cli.paths import user_path

FIRST_NOTEBOOK = "00_lab.ipynb"
CONTENTS = "labdist.cli.notebook_contents.LabdistNotebooks"  # notebooks open unmodified


def notebooks_dir() -> Path | None:
    """The notebooks/ folder next to the package (a checkout or an editable install)."""
    here = Path(__file__).resolve().parent.parent.parent / "notebooks"
    return here if here.is_dir() else None


def lab_command(directory: Path, port: int | None, no_browser: bool,
                extra: list[str]) -> list[str]:
    """The `jupyter lab` command line: served from `directory`, opening the lab notebook."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={directory}",
           f"--ServerApp.contents_manager_class={CONTENTS}"]
    if (directory / FIRST_NOTEBOOK).is_file():
        cmd.append(f"--LabApp.default_url=/lab/tree/{FIRST_NOTEBOOK}")
    if port is not None:
        cmd.append(f"--ServerApp.port={port}")
    if no_browser:
        cmd.append("--no-browser")
    return cmd + list(extra)


def root_flags(extra: list[str], euid: int | None = None) -> list[str]:
    """`--allow-root` when running as root (containers, Binder-like images, CI), where
    JupyterLab would otherwise refuse to start; said in one line, since it is a choice."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0 or any("allow-root" in a or "allow_root" in a for a in extra):
        return []
    print("Running as root: passing --allow-root to JupyterLab", flush=True)
    return ["--allow-root"]


def lab(directory: str | None, port: int | None, no_browser: bool, extra: list[str]) -> int:
    if importlib.util.find_spec("jupyterlab") is None:
        raise UserError("JupyterLab is not installed here: pip install -e \".[lab]\" (or "
                        "\"labdist[lab]\")")
    if directory is None:
        found = notebooks_dir()
        if found is None:
            raise UserError("no notebooks folder next to this labdist (an install from a "
                            "wheel): pass the folder to serve, `labdist lab PATH`")
        path = found
    else:
        path = user_path("the folder", directory).resolve()
        if not path.is_dir():
            raise UserError(f"{directory!r} is not a folder")
    print(f"JupyterLab on {path} (Ctrl-C to stop)", flush=True)
    # labdist's own notebooks are saved without outputs: running them leaves git clean
    command = lab_command(path, port, no_browser,
                          save_options(path == notebooks_dir()) + extra + root_flags(extra))
    # Become JupyterLab: a child would be orphaned when `labdist lab` gets SIGTERM.
    os.execv(command[0], command)
    return 0  # not reached
