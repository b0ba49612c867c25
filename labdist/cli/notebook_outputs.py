"""Saving labdist's own notebooks without outputs, so running them never dirties the checkout.

JupyterLab autosaves a notebook with its outputs, execution counts and widget state, which
change on every run. `labdist lab` (serving the package's notebooks/) passes `save_options()`
to Jupyter's contents manager: every save goes through `strip_outputs` first. What the
browser shows is untouched; only the file on disk stays as committed.
"""

from __future__ import annotations

from typing import Any

HOOK = "labdist.cli.notebook_outputs.strip_outputs"


def strip_outputs(model: dict[str, Any], **_: Any) -> None:
    """A Jupyter `pre_save_hook`: drop outputs, execution counts, per-cell timing, saved
    widget state and the kernel's version details (`language_info` keeps its name, as
    committed) from a notebook model, in place (other files pass through)."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    notebook = model["content"]
    metadata = notebook.get("metadata", {})
    metadata.pop("widgets", None)
    info = metadata.get("language_info")
    if isinstance(info, dict) and "name" in info:
        metadata["language_info"] = {"name": info["name"]}
    for cell in notebook.get("cells", []):
        cell.get("metadata", {}).pop("execution", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None


def save_options(serving_package_notebooks: bool) -> list[str]:
    """The Jupyter options that make saves strip outputs: only for labdist's own notebooks
    (a folder of the user's keeps its outputs)."""
    return [f"--ContentsManager.pre_save_hook={HOOK}"] if serving_package_notebooks else []
