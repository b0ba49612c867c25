"""notebooks/00_lab.ipynb (where Binder opens) run headless in a real kernel (nbclient) and
checked: shared by tests/lab/test_lab_notebook.py (this interpreter) and tests/app/test_binder.py
(the Binder venv's interpreter).

The notebook takes ~20 s to run. It used to run three times in a full run, with three sets of
checks: in the test venv by tests/app/test_notebooks.py and by tests/lab/test_lab_notebook.py,
and in the Binder venv by tests/app/test_binder.py. `run_and_check` now makes every check those
three made, and the notebook runs once per session: in the Binder venv when test_binder's test
is selected (CI's full run), else in the test venv (e.g. the README's quick selection,
`-m "not browser and not binder and not multihost"`). See `binder_runs_it`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "00_lab.ipynb"
BINDER_TEST = "tests/app/test_binder.py::test_the_lab_notebook_runs_in_the_binder_environment"
WIDGET = "application/vnd.jupyter.widget-view+json"
CELL_TIMEOUT_S = 240
SUMMARY = """import json
print(json.dumps({"state": lab.state, "steps": lab.step_count, "kind": lab.config.kind,
                  "events": [e.text for e in lab.events],
                  "spread": [lab.history.spread[i] for i in (149, -1)],
                  "max_spread": max(lab.history.spread)}))
lab.close()"""


def binder_runs_it(session) -> bool:
    """Whether this pytest session also runs `BINDER_TEST` (collected and selected: marks,
    -k and --deselect are already applied to `session.items`), which makes the same checks
    on the same notebook in the Binder venv."""
    return any(item.nodeid.endswith(BINDER_TEST) for item in session.items)


def _kernel(tmp_path: Path, python: str) -> KernelManager:
    """A kernel of exactly `python` (a user-wide python3 could be another one)."""
    spec = tmp_path / "kernels" / "labdist-lab"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "labdist", "language": "python"}))
    return KernelManager(kernel_name="labdist-lab",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


def run_and_check(tmp_path: Path, python: str = sys.executable) -> None:
    """Run the lab notebook top to bottom in a kernel of `python`, then a summary cell: every
    cell runs without an error, the notebook prints nothing (the lab's background thread writes
    only into its widgets), shows its panel once, ends by waiting for the run, and the run did
    what the lesson says."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(SUMMARY))  # what the run did, then close
    km = _kernel(tmp_path, python)
    try:  # raises CellExecutionError naming the failing cell
        NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S,
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:  # nbclient shuts down only kernels it made itself: this one (and its cluster) too
        if km.has_kernel:
            km.shutdown_kernel()  # graceful: the kernel closes its LocalCluster on exit
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    *lesson, summary = code
    outputs = [(i, o) for i, c in enumerate(lesson) for o in c.outputs]
    stray = [(i, o) for i, o in outputs
             if o.output_type != "display_data" or WIDGET not in o.get("data", {})]
    assert stray == [], stray  # no text, no warnings, no errors: only the panel
    shown = [i for i, _ in outputs]
    assert shown == [0]  # lab.show() displays the panel once
    (out,) = summary.outputs
    got = json.loads(out.text)
    assert got["state"] == "idle" and got["kind"] == "mirrored"
    assert got["steps"] == 150 + 150 + 100 + 100 + 100
    assert got["events"][:2] == ["synchronization ON_WRITE → ON_READ; sync_period 10 → 0",
                                 "synchronization ON_READ → ON_WRITE"]
    assert got["events"][2].startswith("kind mirrored → ps_async; delays [0.0, 0.0] → ")
    assert got["spread"] == [0.0, 0.0] and got["max_spread"] > 0.05  # drifted, then rejoined
