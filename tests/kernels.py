"""A real Jupyter kernel driven the way JupyterLab drives one: cells executed over the kernel's
channels, ■ as `KernelManager.interrupt_kernel()` (SIGINT to the kernel's whole process
group), restart and shutdown through the manager. For tests of what a notebook user does."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cell:
    """What one executed cell gave: its status ("ok", "error"), the error's name, and its
    printed text (stdout and stderr, in order)."""

    status: str
    ename: str = ""
    evalue: str = ""
    text: str = ""
    seconds: float = 0.0  # from the interrupt (or the request) to the kernel's idle
    error_after_s: float | None = None  # from the interrupt to the error's arrival
    traceback: str = ""  # the error's traceback, colours removed

    def last_json(self):
        """The last line the cell printed, read as JSON (the cells below print one)."""
        return json.loads(self.text.strip().splitlines()[-1])


@dataclass
class Kernel:
    """One ipykernel of this interpreter, importing labdist from this checkout."""

    folder: Path
    manager: KernelManager = field(init=False)

    def __post_init__(self) -> None:
        spec = self.folder / "kernels" / "labdist-life"
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "labdist", "language": "python"}))
        self.manager = KernelManager(
            kernel_name="labdist-life",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.manager.start_kernel(env={**os.environ, "PYTHONPATH": path},
                                  cwd=str(self.folder))
        self._connect()

    def _connect(self) -> None:
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=90)

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid

    def run(self, code: str, timeout: float = 240) -> Cell:
        """Execute `code` and wait for it to end."""
        msg_id = self.client.execute(code)
        return self._collect(msg_id, None, timeout)

    def run_ok(self, code: str, timeout: float = 240) -> Cell:
        cell = self.run(code, timeout)
        assert cell.status == "ok", f"{cell.traceback}\n{cell.text}"
        return cell

    def interrupted(self, code: str, after: float, timeout: float = 120) -> Cell:
        """Execute `code`, press ■ `after` seconds later, and wait for the cell to end."""
        msg_id = self.client.execute(code)
        time.sleep(after)
        asked = time.monotonic()
        self.manager.interrupt_kernel()
        return self._collect(msg_id, asked, timeout)

    def _collect(self, msg_id: str, asked: float | None, timeout: float) -> Cell:
        start = asked if asked is not None else time.monotonic()
        text, ename, evalue, error_at, trace = [], "", "", None, ""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.1))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                ename, evalue, error_at = content["ename"], content["evalue"], time.monotonic()
                trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = self.client.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.client.get_shell_msg(timeout=30)
        return Cell(reply["content"]["status"], ename, evalue, "".join(text),
                    time.monotonic() - start,
                    None if error_at is None or asked is None else error_at - asked, trace)

    def children(self) -> list[int]:
        """The pids of every process below the kernel (its whole tree)."""
        return descendants(self.pid)

    def restart(self) -> None:
        self.client.stop_channels()
        self.manager.restart_kernel(now=False)
        self._connect()

    def shutdown(self, now: bool = False) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=now)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (children of children too)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)
