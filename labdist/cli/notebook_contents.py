"""labdist's notebooks open unmodified in JupyterLab.

The notebooks are committed with `language_info` holding only the language's name (the save
hook in notebook_outputs.py strips the rest: the Python version differs on every machine).
JupyterLab fills in the running kernel's full `language_info` when a notebook's kernel starts,
and that change alone marks a freshly opened notebook modified (●), as if it had been edited.
This contents manager hands JupyterLab the notebook with the full `language_info` of this
interpreter's kernel already in place, so there is nothing to change; on disk nothing moves.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


def kernel_language_info() -> dict[str, Any] | None:
    """What an IPython kernel of this interpreter reports as its `language_info` (None
    without ipykernel here: then JupyterLab fills it in, as it always did)."""
    try:
        from ipykernel.ipkernel import IPythonKernel
    except ImportError:
        return None
    return dict(IPythonKernel.language_info)


def fill_language_info(model: dict[str, Any]) -> None:
    """A notebook model whose `language_info` is only {"name": "python"} (as committed) gets
    the kernel's full one, in place; anything else is left as it is."""
    content = model.get("content") if model.get("type") == "notebook" else None
    if not isinstance(content, dict):
        return
    metadata = content.get("metadata", {})
    if metadata.get("language_info") == {"name": "python"}:
        metadata["language_info"] = kernel_language_info() or metadata["language_info"]


class LabdistNotebooks(AsyncLargeFileManager):
    """Jupyter's default contents manager, reading notebooks as `fill_language_info` says."""

    async def get(self, path: str, content: bool = True, type: str | None = None,
                  format: str | None = None, **kwargs: Any) -> dict[str, Any]:
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        fill_language_info(model)
        return model
