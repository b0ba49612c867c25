"""A real JupyterLab and a real browser for the lab's tests and benchmark: JupyterLab started on
127.0.0.1 with a token in a temporary folder of its own (settings, kernelspec, workspaces),
Debian's chromium driven by Playwright (never `playwright install`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
KERNEL = "labdist-test"
SUBSHELLS = {"on": "perCommTarget", "off": "disabled"}  # JupyterLab's commsOverSubshells
OUTPUT = Path(__file__).resolve().parents[3] / "tests-output" / "browser"  # gitignored


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(root: Path, subshells: str) -> Path:
    """User settings: comms over subshells on or off, and no news/update toasts."""
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "kernels-settings.jupyterlab-settings").write_text(
        json.dumps({"commsOverSubshells": SUBSHELLS[subshells]}))
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"checkForUpdates": False, "fetchNews": "false", "doNotDisturbMode": True}))
    return root / "settings"


def _kernelspec(root: Path) -> Path:
    """A kernel of exactly this interpreter (a user-wide python3 could be another one)."""
    spec = root / "data" / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "labdist test", "language": "python"}))
    return root / "data"


def write_notebook(path: Path, cells: list[str]) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "labdist test",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


class JupyterLab:
    """`with JupyterLab(tmp, subshells="on") as lab: lab.url(...)`."""

    def __init__(self, root: Path, subshells: str = "on", timeout: float = 90.0):
        if subshells not in SUBSHELLS:
            raise ValueError(f"subshells={subshells!r}; allowed: {', '.join(SUBSHELLS)}")
        self.root, self.subshells, self.timeout = Path(root), subshells, timeout
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "jupyterlab.log"

    def url(self, path: str = "lab") -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def __enter__(self) -> JupyterLab:
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(_settings(self.root, self.subshells)),
                   JUPYTER_DATA_DIR=str(_kernelspec(self.root)),
                   JUPYTER_CONFIG_DIR=str(self.root / "config"),
                   JUPYTER_RUNTIME_DIR=str(self.root / "runtime"),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.root / "workspaces"))
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--ServerApp.allow_root=True"]  # CI runs as root
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.root, stdout=self.log.open("wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.proc.returncode}):\n"
                                   + self.log.read_text()[-3000:])
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.url("api/status"), timeout=2).read()
                return self
            time.sleep(0.3)
        self.__exit__()
        raise TimeoutError(f"JupyterLab did not answer within {self.timeout} s:\n"
                           + self.log.read_text()[-3000:])

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            for k in self.api("api/kernels"):  # a clean shutdown: the kernels close clusters
                self.api(f"api/kernels/{k['id']}", method="DELETE")
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # JupyterLab and what it started
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def browser(width: int = 1500, height: int = 1500):
    """A headless Debian chromium page (default 1500 x 1500: the whole panel in view)."""
    if not Path(CHROMIUM).is_file():
        raise FileNotFoundError(f"{CHROMIUM} is missing: install Debian's chromium "
                                "(apt-get install chromium); .ci/run does")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            b.close()


class Notebook:
    """A notebook open in JupyterLab, run cell by cell as a person would."""

    def __init__(self, page, server: JupyterLab, name: str, timeout_ms: float = 120_000):
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        self._timeout_error = PlaywrightTimeout
        self.page = page
        self.timeout = timeout_ms
        page.set_default_timeout(timeout_ms)
        page.goto(server.url(f"lab/tree/{name}"))
        page.locator(".jp-Notebook .jp-Cell").first.wait_for()
        idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        idle.or_(page.locator(".jp-Dialog")).first.wait_for()
        self.check_dialog()  # accepts "Select Kernel": our kernel is preselected
        idle.wait_for()

    def cell(self, i: int):
        return self.page.locator(".jp-Notebook .jp-Cell").nth(i)

    def run(self, i: int, wait: bool = True) -> None:
        """Select cell i and press Shift+Enter; with `wait`, until its prompt shows a
        number."""
        self.check_dialog()
        prompt = self.cell(i).locator(".jp-InputArea-prompt")
        before = prompt.inner_text()
        for _ in range(5):  # a key press while the kernel is still connecting can be lost
            self.check_dialog()  # JupyterLab can ask for the kernel late, after "idle"
            try:
                self.cell(i).locator(".jp-InputArea-editor").click(timeout=10_000)
            except self._timeout_error:  # covered by a dialog that came meanwhile
                continue
            self.page.keyboard.press("Shift+Enter")
            try:
                self.page.wait_for_function(
                    "([el, before]) => el.textContent.includes('*') || "
                    "(/\\[\\d+\\]/.test(el.textContent) && el.textContent !== before)",
                    arg=[prompt.element_handle(), before], timeout=5000)
                break
            except self._timeout_error:  # press again
                continue
        if wait:
            self.wait_done(i)

    def check_dialog(self) -> None:
        """A JupyterLab dialog blocks every click. "Select Kernel" (shown late at times) is
        accepted: our kernel is preselected. Any other (e.g. a kernel that failed to start)
        raises what it says instead of timing out behind it."""
        dialog = self.page.locator(".jp-Dialog")
        if dialog.count() and dialog.filter(has_text="Select Kernel").count():
            dialog.locator(".jp-mod-accept").click()
            dialog.wait_for(state="detached")
        if dialog.count():
            raise RuntimeError("JupyterLab shows a dialog: "
                               + " ".join(dialog.first.inner_text().split())[:500])

    def wait_done(self, i: int, timeout_ms: float | None = None) -> None:
        prompt = self.cell(i).locator(".jp-InputArea-prompt")
        self.page.wait_for_function(
            "el => /\\[\\d+\\]/.test(el.textContent)", arg=prompt.element_handle(),
            timeout=timeout_ms or self.timeout)

    def running(self, i: int) -> bool:
        return "*" in self.cell(i).locator(".jp-InputArea-prompt").inner_text()

    def errors(self) -> list[str]:
        return self.page.locator(".jp-OutputArea-output[data-mime-type*='error'], "
                                 ".jp-RenderedText[data-mime-type='application/vnd.jupyter"
                                 ".stderr']").all_inner_texts()


POINTS = "() => document.querySelector('.labdist-spread').labdist.x.length >= {n}"


@contextlib.contextmanager
def open_lab(tmp_path: Path, cells: list[str], *, subshells: str = "on",
             size: tuple[int, int] = (1280, 800), points: int = 20, name: str = "lab"):
    """The opening every lab test shares: the notebook `cells` written, JupyterLab started,
    a `size` browser on it, cell 0 run (it shows the panel), cell 1 run (it starts training),
    and `points` steps on the spread chart. Yields the `Notebook` (its `page` too); a failure
    leaves a screenshot `OUTPUT/<name>-failed.png`."""
    write_notebook(tmp_path / "lab.ipynb", cells)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with JupyterLab(tmp_path, subshells) as server, browser(*size) as page:
        nb = Notebook(page, server, "lab.ipynb")
        try:
            nb.run(0)
            page.locator(".labdist-panel").wait_for()
            nb.run(1)
            page.wait_for_function(POINTS.format(n=points))
            yield nb
        except BaseException:
            page.screenshot(path=str(OUTPUT / f"{name}-failed.png"))
            raise
