"""labdist's notebooks open unmodified: served by the real `labdist lab`, each notebook opened
in JupyterLab in a real browser shows no "modified" mark (●) once its kernel is up. Committed
with only the language's name in `language_info`, they used to: JupyterLab fills in the
kernel's full `language_info` at kernel start, and that change alone marks a notebook edited."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import jupyter_server
import pytest
from harness import OUTPUT, browser

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"


def _api(base: str, path: str, method: str = "GET") -> dict | list | None:
    request = urllib.request.Request(f"{base}/{path}?token={jupyter_server.TOKEN}",
                                     method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def test_every_notebook_opens_unmodified(tmp_path):
    from ipykernel.ipkernel import IPythonKernel

    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    committed = {n: (NOTEBOOKS / n).read_bytes() for n in names}
    port, log = jupyter_server.free_port(), tmp_path / "lab.log"
    command = [sys.executable, "-m", "labdist", "lab", "--no-browser", "--port", str(port),
               "--", *jupyter_server.root_flag()]
    with jupyter_server.running(command, port, tmp_path, log) as base, \
            browser(1280, 800) as page:
        # what JupyterLab gets: the kernel's whole language_info, version and all
        model = _api(base, f"api/contents/{names[0]}")
        assert model["content"]["metadata"]["language_info"] == IPythonKernel.language_info
        dirty = {}
        for name in names:
            # ?reset: this notebook alone (JupyterLab would restore the earlier ones' tabs)
            page.goto(f"{base}/lab/tree/{name}?reset&token={jupyter_server.TOKEN}")
            page.locator(".jp-Notebook .jp-Cell:visible").first.wait_for(timeout=60_000)
            # .first: a narrow toolbar keeps a second copy of the indicator in its popup
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']:visible").first \
                .wait_for(timeout=60_000)
            page.wait_for_timeout(1000)  # metadata filled in after "idle" would show by now
            tab = page.locator(".lm-TabBar-tab.jp-mod-current", has_text=name)
            dirty[name] = "jp-mod-dirty" in (tab.get_attribute("class") or "")
            if dirty[name]:
                OUTPUT.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(OUTPUT / f"opened-modified-{name}.png"))
        for kernel in _api(base, "api/kernels"):
            _api(base, f"api/kernels/{kernel['id']}", method="DELETE")
    assert dirty == dict.fromkeys(names, False)
    assert {n: (NOTEBOOKS / n).read_bytes() for n in names} == committed  # nothing saved
