"""Start a real Jupyter server for a test and talk HTTP to it (shared by test_cli and
test_binder)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

TOKEN = "labdist-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str, str]:
    """(status, Location header, body) of a GET, without following redirects."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(url, timeout=10) as r:
            return r.status, r.headers.get("Location", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location", ""), ""


def root_flag() -> list[str]:
    """Jupyter refuses to run as root (CI does) unless told."""
    return ["--allow-root"] if os.geteuid() == 0 else []


@contextlib.contextmanager
def running(command: list[str], port: int, workdir: Path, log: Path,
            start_timeout: float = 90) -> Iterator[str]:
    """Run `command` (a Jupyter server on `port`, token TOKEN) until the block ends; yields
    its base URL once it answers."""
    env = {k: v for k, v in os.environ.items() if k != "LABDIST_SCHEDULER"}
    env.update(JUPYTER_TOKEN=TOKEN, JUPYTER_RUNTIME_DIR=str(log.parent / "jupyter-runtime"))
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                env=env, stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                assert proc.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
                with contextlib.suppress(OSError):
                    if get(f"{base}/api/status?token={TOKEN}")[0] == 200:
                        break
                assert time.monotonic() < deadline, f"no answer:\n{log.read_text()[-3000:]}"
                time.sleep(0.3)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
