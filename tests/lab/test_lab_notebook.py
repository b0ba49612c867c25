"""notebooks/00_lab.ipynb runs top to bottom headless (nbclient, a real kernel), ends by waiting
for the run, and prints nothing: the lab's background thread writes only into its widgets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "00_lab.ipynb"
WIDGET = "application/vnd.jupyter.widget-view+json"
SUMMARY = """import json
print(json.dumps({"state": lab.state, "steps": lab.step_count, "kind": lab.config.kind,
                  "events": [e.text for e in lab.events],
                  "spread": [lab.history.spread[i] for i in (149, -1)],
                  "max_spread": max(lab.history.spread)}))
lab.close()"""


def _kernel(tmp_path: Path) -> KernelManager:
    """A kernel of exactly this interpreter."""
    spec = tmp_path / "kernels" / "labdist-lab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "labdist", "language": "python"}))
    return KernelManager(kernel_name="labdist-lab",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


def test_committed_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata
    assert code[-1].source.strip() == "lab.wait()"  # it ends by waiting for the run


@pytest.mark.timeout(300)
def test_runs_headless_without_stray_output(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(SUMMARY))  # what the run did, then close
    km = _kernel(tmp_path)
    try:
        NotebookClient(nb, km=km, timeout=240,
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:  # nbclient shuts down only kernels it made itself
        if km.has_kernel:
            km.shutdown_kernel()
    code = [c for c in nb.cells if c.cell_type == "code"]
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
