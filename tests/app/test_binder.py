"""The Binder files, checked the way Binder uses them: repo2docker reads them (linted with
`--no-build`: there is no docker here), and a fresh environment built as Binder builds it — a
venv from binder/requirements.txt, then binder/postBuild — is complete: every module any
notebook imports imports there, the lab notebook (where Binder opens) runs top to bottom, and
JupyterLab opens on it. What each notebook shows is checked by tests/app/test_notebooks.py,
which runs every one of them in the test environment (the same pins, plus the test extra):
running them all a second time here cost two minutes of CI for no other check. The lab notebook
is the exception: it runs only here, with every check tests/lab/test_lab_notebook.py makes
(tests/lab_notebook.py), and that test skips when this module's is selected too.

Slow (a pip install of the pinned stack, ~1.5 min from pip's cache, which these tests use
and fill), so it runs once per CI and the environment is shared by the module's tests.
"""

from __future__ import annotations

import ast
import contextlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import jupyter_server
import lab_notebook
import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from test_notebooks import NOTEBOOKS

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"
LAB_URL = "/lab/tree/notebooks/00_lab.ipynb"
INSTALL_TIMEOUT_S = 900

pytestmark = [pytest.mark.binder, pytest.mark.timeout(INSTALL_TIMEOUT_S)]


def _env() -> dict[str, str]:
    """This environment, minus anything that would disable pip's cache or leak our venv."""
    drop = {"PIP_NO_CACHE_DIR", "PIP_REQUIRE_VIRTUALENV", "VIRTUAL_ENV", "PYTHONPATH",
            "LABDIST_SCHEDULER"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _sh(command: list[str], timeout: float = INSTALL_TIMEOUT_S, **kwargs) -> str:
    """Run `command`; its stdout (and stderr, after it) when it succeeds."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL, **kwargs)
    assert result.returncode == 0, (f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n"
                                    f"{result.stderr[-3000:]}")
    return result.stdout + "\n" + result.stderr


def _venv(path: Path) -> Path:
    """A fresh venv with the python running these tests (3.11, as binder/runtime.txt says)."""
    _sh([sys.executable, "-m", "venv", str(path)], env=_env())
    return path


def _pins() -> dict[str, str]:
    pins = {}
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", line)
            assert match, f"binder/requirements.txt: {line!r} is not pinned as NAME==VERSION"
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


# -- the files ----------------------------------------------------------------------------------
def test_requirements_pin_what_labdist_and_its_notebooks_need():
    """Every dependency of labdist and of its `lab` and `datasets` extras (the notebooks use
    them) is pinned to a version that satisfies pyproject.toml."""
    pins, project = _pins(), _project()
    extras = project["optional-dependencies"]
    needed = [Requirement(r) for r in
              [*project["dependencies"], *extras["lab"], *extras["datasets"]]]
    for req in needed:
        names = [req.name, *req.extras] if req.name == "dask" else [req.name]  # dask[distributed]
        for name in map(canonicalize_name, names):
            assert name in pins, f"binder/requirements.txt does not pin {name} ({req})"
        version = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), \
            f"binder pins {req.name}=={version}, pyproject.toml asks {req}"


def test_runtime_and_post_build():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+)\.(\d+)", runtime)
    assert match, runtime
    assert SpecifierSet(_project()["requires-python"]).contains(f"{match[1]}.{match[2]}.0")
    assert sys.version_info[:2] == (int(match[1]), int(match[2])), \
        "these tests build the Binder venv with the python running them"
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK), "binder/postBuild must be executable"
    text = post.read_text()
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text


def test_repo2docker_reads_the_configuration(tmp_path):
    """`jupyter-repo2docker --no-build` turns the repository into the Dockerfile Binder would
    build (no docker needed): python from runtime.txt, the pinned requirements, postBuild."""
    venv = _venv(tmp_path / "r2d")
    _sh([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--progress-bar", "off",
         "jupyter-repo2docker==2026.4.0"], env=_env())
    out = _sh([str(venv / "bin" / "jupyter-repo2docker"), "--no-build", "--debug", str(REPO)],
              timeout=300, env=_env())
    python = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    assert f"python={python}" in out
    assert re.search(r'pip install --no-cache-dir -r "?binder/requirements.txt', out), out[-2000:]
    assert re.search(r"RUN \./binder/postBuild", out), out[-2000:]


# -- an environment built as Binder builds it ---------------------------------------------------
@pytest.fixture(scope="module")
def binder_venv(tmp_path_factory) -> Path:
    venv = _venv(tmp_path_factory.mktemp("binder") / "venv")
    python = str(venv / "bin" / "python")
    _sh([python, "-m", "pip", "install", "-q", "--progress-bar", "off", "-r",
         str(BINDER / "requirements.txt")], env=_env())
    env = _env()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    _sh([str(BINDER / "postBuild")], cwd=REPO, env=env)
    return venv


def test_the_environment_is_complete(binder_venv: Path):
    python = str(binder_venv / "bin" / "python")
    _sh([python, "-m", "pip", "check"], env=_env())  # labdist's dependencies, all satisfied
    where = _sh([python, "-c", "import labdist; print(labdist.__file__)"], cwd="/",
                env=_env()).split("\n", 1)[0]
    assert Path(where) == REPO / "labdist" / "__init__.py"  # editable: the checkout itself
    assert "demo" in _sh([str(binder_venv / "bin" / "labdist"), "--help"], env=_env())


def notebook_imports(path: Path) -> set[str]:
    """The modules a notebook's code cells import (top-level names of `import` and `from`)."""
    found = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return found


def test_every_module_a_notebook_imports_is_there(binder_venv: Path):
    modules = sorted(set().union(*(notebook_imports(p) for p in NOTEBOOKS)))
    assert "labdist" in modules and "matplotlib.pyplot" in modules
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    _sh([str(binder_venv / "bin" / "python"), "-c", code], cwd=str(REPO / "notebooks"),
        env=_env())


def test_the_lab_notebook_runs_in_the_binder_environment(binder_venv: Path, tmp_path):
    """Every check tests/lab/test_lab_notebook.py makes on the lab notebook, made here in the
    Binder venv; that test skips when this one is selected too (see tests/lab_notebook.py)."""
    assert REPO / LAB_URL.removeprefix("/lab/tree/") == lab_notebook.NOTEBOOK
    lab_notebook.run_and_check(tmp_path, python=str(binder_venv / "bin" / "python"))


def test_jupyterlab_opens_the_lab_notebook(binder_venv: Path, tmp_path):
    port = jupyter_server.free_port()
    command = [str(binder_venv / "bin" / "jupyter"), "lab", "--no-browser", f"--port={port}",
               *jupyter_server.root_flag()]
    with jupyter_server.running(command, port, REPO, tmp_path / "lab.log") as base:
        token = jupyter_server.TOKEN
        status, location, _ = jupyter_server.get(f"{base}/?token={token}")
        assert status == 302 and location.split("?")[0] == LAB_URL, (status, location)
        status, _, body = jupyter_server.get(f"{base}/api/contents/notebooks?token={token}")
        assert status == 200
        served = {c["name"] for c in json.loads(body)["content"]}
        assert {p.name for p in NOTEBOOKS} <= served
        # jupyter-server-proxy: the lab's dashboard link, {prefix}proxy/{port}/status, opens
        with _http_server("dashboard here") as dashboard_port:
            status, _, body = jupyter_server.get(
                f"{base}/proxy/{dashboard_port}/status?token={token}")
            assert (status, body) == (200, "dashboard here")


@contextlib.contextmanager
def _http_server(text: str):
    """A local HTTP server answering `text` (a stand-in for the Dask dashboard); its port."""
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
