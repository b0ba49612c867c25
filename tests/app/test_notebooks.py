"""Every notebook in notebooks/ is committed without outputs, stays so when `labdist lab` saves
it, and runs top to bottom, headless, in a real kernel of this interpreter (nbclient); the lab
notebook, 00_lab.ipynb, runs once per session elsewhere, with these checks and more (see
RUN_HERE). New notebooks are picked up automatically."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

import lab_notebook
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# The notebooks run here. The lab's, 00_lab.ipynb, runs once per session elsewhere, with these
# checks and more (lab_notebook.run_and_check): in the Binder venv by tests/app/test_binder.py
# when that is selected, else in this venv by tests/lab/test_lab_notebook.py.
RUN_HERE = [p for p in NOTEBOOKS if p != lab_notebook.NOTEBOOK]
CELL_TIMEOUT_S = 180  # one cell
NOTEBOOK_TIMEOUT_S = 300  # a whole notebook, kernel start included
_LINK = re.compile(r"\]\(([^)#\s]+\.ipynb)(?:#[^)]*)?\)")


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def kernel_manager(tmp_path: Path, python: str = sys.executable) -> KernelManager:
    """A kernel of exactly `python`: a kernelspec of our own, so a user-wide `python3` kernel
    of another environment can never be picked up instead."""
    spec_dir = tmp_path / "kernels" / "labdist-test"
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "labdist test", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
    return KernelManager(kernel_name="labdist-test", kernel_spec_manager=specs)


def execute(path: Path, tmp_path: Path, python: str = sys.executable) -> nbformat.NotebookNode:
    """Run a notebook in its own folder; raises CellExecutionError naming the failing cell."""
    nb = nbformat.read(path, as_version=4)
    km = kernel_manager(tmp_path, python)
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:  # nbclient shuts down only kernels it made itself: this one (and its cluster) too
        if km.has_kernel:
            km.shutdown_kernel()  # graceful: the kernel closes its LocalCluster on exit
    return nb


def test_the_notebooks_are_there():
    names = {p.name for p in NOTEBOOKS}
    for name in ("01_variable_synchronization.ipynb", "02_variable_aggregation.ipynb",
                 "03_mirrored_training.ipynb"):
        assert name in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_without_outputs(path: Path):
    """Outputs, execution counts and widget state stay out of git (they change every run)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", path.name
    assert "widgets" not in nb.metadata, f"{path.name}: widget state is committed"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
        assert not cell.metadata.get("execution"), f"{path.name} cell {i} has timing metadata"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_links_between_notebooks_resolve(path: Path):
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "markdown")
    for target in _LINK.findall(text):
        assert (path.parent / target).is_file(), f"{path.name} links to missing {target}"


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", RUN_HERE, ids=_ids(RUN_HERE))
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path):
    """Each notebook but the lab's (see RUN_HERE)."""
    nb = execute(path, tmp_path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


def test_the_readme_links_resolve_and_list_every_notebook():
    """A newcomer's map: every relative link in the README leads to a file, every notebook
    is listed, and the Binder badge opens the lab notebook that postBuild makes the default."""
    root = NOTEBOOK_DIR.parent
    readme = (root / "README.md").read_text()
    for target in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", readme):
        assert (root / target).exists(), f"README links to missing {target}"
    for path in NOTEBOOKS:
        assert f"](notebooks/{path.name})" in readme, f"README does not list {path.name}"
    badge = re.search(r"mybinder\.org/v2/gh/[^)\s]+\?urlpath=lab/tree/([^)\s]+)\)", readme)
    assert badge and (root / badge[1]).is_file(), "the Binder badge must open a notebook"
    assert f"/lab/tree/{badge[1]}" in (root / "binder" / "postBuild").read_text()


def test_checkpoints_are_ignored_by_git():
    """JupyterLab writes .ipynb_checkpoints/ next to every notebook it saves."""
    ignored = (NOTEBOOK_DIR.parent / ".gitignore").read_text().split()
    assert ".ipynb_checkpoints/" in ignored


def test_the_save_hook_strips_what_a_run_adds():
    from labdist.cli.notebook_outputs import strip_outputs

    nb = nbformat.read(NOTEBOOK_DIR / "01_variable_synchronization.ipynb", as_version=4)
    clean = nbformat.writes(nb)
    _add_run_traces(nb)
    model = {"type": "notebook", "content": nb}
    strip_outputs(model=model, path="x.ipynb", contents_manager=None)
    assert nbformat.writes(model["content"]) == clean
    text = {"type": "file", "content": "print(1)"}
    strip_outputs(model=text, path="x.py", contents_manager=None)
    assert text["content"] == "print(1)"


def _add_run_traces(nb: nbformat.NotebookNode) -> None:
    """What running and saving a notebook in JupyterLab adds to it."""
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.metadata["language_info"] = {  # what a running kernel reports, version and all
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
        "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3", "version": "3.11.7"}
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
        cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}


@pytest.mark.timeout(120)
def test_labdist_lab_saves_its_notebooks_without_outputs(tmp_path: Path):
    """Through the real `labdist lab` (serving the package's notebooks/): a notebook saved
    with outputs, as JupyterLab's autosave does, stays byte-identical on disk."""
    import jupyter_server

    path = NOTEBOOK_DIR / "01_variable_synchronization.ipynb"
    committed = path.read_bytes()
    nb = nbformat.reads(committed.decode(), as_version=4)
    _add_run_traces(nb)
    port, log = jupyter_server.free_port(), tmp_path / "lab.log"
    command = [sys.executable, "-m", "labdist", "lab", "--no-browser", "--port", str(port),
               "--", *jupyter_server.root_flag()]
    try:
        with jupyter_server.running(command, port, tmp_path, log) as base:
            request = urllib.request.Request(
                f"{base}/api/contents/{path.name}", method="PUT",
                headers={"Authorization": f"token {jupyter_server.TOKEN}",
                         "Content-Type": "application/json"},
                data=json.dumps({"type": "notebook", "format": "json", "content": nb}).encode())
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
        assert path.read_bytes() == committed
    finally:
        path.write_bytes(committed)
