"""notebooks/00_lab.ipynb runs top to bottom headless (nbclient, a real kernel), ends by waiting
for the run, and prints nothing: the lab's background thread writes only into its widgets.

The run and its checks are `lab_notebook.run_and_check` (tests/lab_notebook.py). When this
session also selects tests/app/test_binder.py's lab-notebook test (CI's full run selects every
mark), that test makes the same checks on the same notebook in the Binder venv and this one
skips, saying so: the notebook runs once per session, and in a selection without the binder
mark (the README's quick command) it still runs here."""

from __future__ import annotations

import nbformat
import pytest
from lab_notebook import BINDER_TEST, NOTEBOOK, binder_runs_it, run_and_check


def test_committed_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata
    assert code[-1].source.strip() == "lab.wait()"  # it ends by waiting for the run


@pytest.mark.timeout(300)
def test_runs_headless_without_stray_output(tmp_path, request):
    if binder_runs_it(request.session):
        pytest.skip(f"{BINDER_TEST} runs the notebook with these same checks in this session")
    run_and_check(tmp_path)
