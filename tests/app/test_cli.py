"""The `labdist` command line, run as a user runs it (a subprocess): `run` against real
`dask scheduler` / `dask worker` processes, `demo` writing its PNG and HTML, `lab` serving
JupyterLab, `info`; and user mistakes ending in one line on stderr, without a traceback."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jupyter_server
import pytest
from clusters import ExternalCluster
from matplotlib.image import imread

LABDIST = [sys.executable, "-m", "labdist"]
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def labdist(*args: str, timeout: float = 180, env: dict | None = None):
    environ = {k: v for k, v in os.environ.items() if k != "LABDIST_SCHEDULER"}
    environ.update(env or {})
    return subprocess.run([*LABDIST, *args], capture_output=True, text=True, timeout=timeout,
                          env=environ, stdin=subprocess.DEVNULL)


def assert_one_line_error(result, code: int, *needles: str) -> None:
    err = result.stderr.strip()
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


# -- help and mistakes ------------------------------------------------------------------------
def test_help_names_every_command_and_option():
    top = labdist("--help")
    assert top.returncode == 0
    for command in ("lab", "demo", "run", "info"):
        assert re.search(rf"^\s+{command}\s", top.stdout, re.M), top.stdout
    run = labdist("run", "--help").stdout
    for text in ("--scheduler", "--strategy", "--steps", "mirrored", "multi-worker",
                 "parameter-server", "sync-replicas", "LABDIST_SCHEDULER"):
        assert text in run, text
    assert "--out" in labdist("demo", "--help").stdout
    assert "--no-browser" in labdist("lab", "--help").stdout


@pytest.mark.parametrize(("args", "code", "needles"), [
    (["run", "--strategy", "bogus", "--scheduler", "tcp://127.0.0.1:1"], 2,
     ["--strategy", "'bogus'", "mirrored", "parameter-server"]),
    (["run", "--scheduler", "foo"], 1, ["'foo'", "tcp://HOST:PORT"]),
    (["run", "--scheduler", "http://127.0.0.1:8786"], 1, ["'http'", "tcp"]),
    (["run"], 1, ["--scheduler", "LABDIST_SCHEDULER"]),
    (["run", "--steps", "0", "--scheduler", "tcp://127.0.0.1:1"], 2, ["--steps", "positive"]),
    (["run", "--steps", "many"], 2, ["--steps", "'many'"]),
    (["bogus"], 2, ["'bogus'", "run"]),
    (["demo", "--replicas", "0"], 2, ["--replicas"]),
    (["demo", "--", "--port", "1"], 2, ["labdist lab"]),
    (["lab", "/no/such/folder"], 1, ["/no/such/folder"]),
    (["lab", "~no-such-user-here/x"], 1, ["~no-such-user-here/x"]),
    (["run", "--scheduler", "tcp://127.0.0.1:99999"], 1, ["99999", "1..65535"]),
    (["demo", "--out", "~no-such-user-here/x"], 1, ["--out", "~no-such-user-here/x"]),
])
def test_user_mistakes_are_one_line(args, code, needles):
    assert_one_line_error(labdist(*args, timeout=60), code, *needles)


def test_nothing_listening_fails_fast_with_one_line():
    port = jupyter_server.free_port()  # bound then released: nothing listens there
    start = time.monotonic()
    result = labdist("run", "--scheduler", f"tcp://127.0.0.1:{port}", timeout=60)
    assert_one_line_error(result, 1, f"tcp://127.0.0.1:{port}", "dask scheduler")
    assert time.monotonic() - start < 30  # not Dask's retry loop until the timeout
    assert_one_line_error(labdist("info", "--scheduler", f"tcp://127.0.0.1:{port}", timeout=60),
                          1, f"tcp://127.0.0.1:{port}")


def test_demo_out_must_be_a_folder(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    assert_one_line_error(labdist("demo", "--out", str(a_file), timeout=60), 1, "--out")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("out", "why"), [
    ("/proc/nope", "not a writable folder"),  # /proc takes no new folders, even from root
    ("/dev/null/report", "'/dev/null' is not a folder"),
])
def test_demo_out_unusable_is_one_line_before_the_run(out, why):
    start = time.monotonic()
    result = labdist("demo", "--out", out, timeout=60)
    assert_one_line_error(result, 1, "--out", repr(out), why)
    assert "step" not in result.stdout  # refused before the demo ran, not after
    assert time.monotonic() - start < 20
    assert not Path(out).exists()


def test_demo_out_leaves_nothing_behind_when_refused(tmp_path):
    from labdist.cli.mistakes import UserError
    from labdist.cli.paths import output_folder, write_atomically

    target = tmp_path / "a" / "b"
    with pytest.raises(RuntimeError), output_folder("--out", str(target)) as folder:
        assert folder == target and folder.is_dir()
        raise RuntimeError("the run failed")
    assert not (tmp_path / "a").exists()  # the folders this run made are gone again
    (tmp_path / "kept").mkdir()
    with output_folder("--out", str(tmp_path / "kept")) as folder, \
            pytest.raises(ZeroDivisionError):
        write_atomically(folder / "x.txt", lambda p: (p.write_text("half"), 1 / 0))
    assert list((tmp_path / "kept").iterdir()) == [] and (tmp_path / "kept").is_dir()
    (tmp_path / "kept" / "f").write_text("a file")
    with pytest.raises(UserError, match="f' is not a folder"), \
            output_folder("--out", str(tmp_path / "kept" / "f" / "g")):
        pass
    assert (tmp_path / "kept" / "f").read_text() == "a file"


# -- demo ---------------------------------------------------------------------------------------
def test_demo_prints_progress_and_writes_png_and_html(tmp_path):
    out = tmp_path / "report"
    result = labdist("demo", "--steps", "6", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    text = result.stdout
    assert "ON_READ  SUM" in text and "cross-replica read=23" in text
    assert re.search(r"step\s+5\s+loss=", text)  # progress of both experiments
    png, html = out / "demo.png", out / "report.html"
    assert f"Chart:  {png}" in text and f"Report: {html}" in text
    assert sorted(p.name for p in out.iterdir()) == ["demo.png", "report.html"]  # no temp files
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    pixels = imread(png)
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 1000  # three readable panels
    assert pixels[..., :3].std() > 0.05  # something is drawn, not a blank canvas
    page = html.read_text()
    assert base64.b64encode(data).decode() in page  # self-contained: the chart is embedded
    rows = re.findall(r"<tr><td>(ON_\w+)</td><td>(\w+)</td><td class=(\w+)>([^<]*)</td>"
                      r"<td>([^<]*)</td><td>([^<]*)</td></tr>", page)
    table = {(s, a): (style, copies, read, warned)
             for s, a, style, copies, read, warned in rows}
    assert len(table) == 8
    assert table[("ON_WRITE", "SUM")] == ("equal", "13, 13", "13", "")
    assert table[("ON_WRITE", "NONE")] == ("diverged", "11, 12", "11",
                                           "ReplicaDivergenceWarning")
    assert table[("ON_READ", "SUM")] == ("local", "11, 12", "23", "")
    assert table[("ON_READ", "NONE")][2] == "ValueError"
    # the final table: mode, step, copies of w, spread, loss
    spreads = dict(re.findall(r"<tr><td>(MEAN|NONE)</td><td>6</td><td>[^<]*</td><td>([^<]*)</td>",
                              page))
    assert float(spreads["MEAN"]) == 0.0 and float(spreads["NONE"]) > 0.1


# -- run on a real `dask scheduler` + `dask worker` cluster -------------------------------------
def _progress(stdout: str) -> list[tuple[int, float]]:
    return [(int(s), float(loss)) for s, loss in
            re.findall(r"^step\s+(\d+)/\d+\s+loss (\S+)", stdout, re.M)]


@pytest.mark.cluster
def test_run_mirrored_on_the_cli_cluster(external: ExternalCluster):
    result = labdist("run", "--scheduler", external.address, "--strategy", "mirrored",
                     "--steps", "40")
    assert result.returncode == 0, result.stdout + result.stderr
    progress = _progress(result.stdout)
    assert [s for s, _ in progress] == list(range(4, 41, 4))  # ten progress lines
    assert progress[-1][1] < progress[0][1]  # it learns
    summary = result.stdout.split("Summary", 1)[1]
    assert "MirroredStrategy(num_replicas_in_sync=2)" in summary
    for worker in external.workers:
        assert worker in summary
    assert "40 at global batch 64" in summary
    assert "identical on every replica" in summary
    accuracy = float(re.search(r"accuracy (\S+)\n", summary).group(1))
    assert accuracy > 0.5  # four classes: well above chance
    assert external.alive()  # labdist leaves a cluster it did not start running


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", ["multi-worker", "parameter-server", "sync-replicas"])
def test_run_other_strategies_on_the_cli_cluster(external: ExternalCluster, strategy):
    result = labdist("run", "--scheduler", external.address, "--strategy", strategy,
                     "--steps", "12", "--batch-size", "32")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [s for s, _ in _progress(result.stdout)] == list(range(2, 13, 2))
    summary = result.stdout.split("Summary", 1)[1]
    assert "12 at global batch 32" in summary
    if strategy == "multi-worker":
        assert "MultiWorkerMirroredStrategy(num_replicas_in_sync=2)" in summary
        assert "identical on every replica" in summary
    else:
        mode = "async" if strategy == "parameter-server" else "sync"
        assert f"mode='{mode}'" in summary
        assert re.search(rf"parameter-server stats \({mode}\): global step 12,", summary)
        assert "staleness:" in summary
    assert external.alive()


@pytest.mark.cluster
def test_run_parameter_server_says_who_computes_and_warns_when_only_one_does(external):
    """Two workers: one holds the parameter server, so one computes; the run says which, and
    warns once (stderr, one line) that async training with one worker has no staleness."""
    result = labdist("run", "--scheduler", external.address, "--strategy", "parameter-server",
                     "--steps", "4", "--batch-size", "32")
    assert result.returncode == 0, result.stdout + result.stderr
    start = result.stdout.split("step ", 1)[0]
    found = re.search(r"1 worker\(s\) compute \((\S+)\), 1 parameter server\(s\) \((\S+)\)",
                      start)
    assert found, start
    assert sorted(found.groups()) == sorted(external.workers)
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith("labdist run: warning: only 1 worker computes")
    assert "no staleness" in warnings[0] and "dask worker" in warnings[0], warnings[0]
    assert "Traceback" not in result.stderr
    assert external.alive()


@pytest.mark.cluster
def test_run_asking_for_more_replicas_than_workers_is_a_one_line_error(external):
    result = labdist("run", "--scheduler", external.address, "--replicas", "3",
                     "--connect-timeout", "1", timeout=60)
    assert_one_line_error(result, 1, "num_replicas=3", "2 worker")
    assert external.alive()


@pytest.mark.cluster
def test_info_lists_versions_and_the_workers(external: ExternalCluster):
    plain = labdist("info", timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert re.search(r"labdist\s+0\.", plain.stdout)
    assert re.search(r"distributed\s+\d", plain.stdout)
    assert re.search(r"GPUs seen here: \d+", plain.stdout)
    listed = labdist("info", "--scheduler", external.address, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"Cluster {external.address}: 2 worker(s)" in listed.stdout
    for worker in external.workers:
        assert re.search(rf"{re.escape(worker)}\s+threads 1\s+memory \S+ GiB\s+GPUs \d",
                         listed.stdout)


# -- lab ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_lab_serves_the_folder_and_opens_the_lab_notebook(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(NOTEBOOKS / "01_variable_synchronization.ipynb", folder / "00_lab.ipynb")
    port, log = jupyter_server.free_port(), tmp_path / "lab.log"
    command = [*LABDIST, "lab", str(folder), "--no-browser", "--port", str(port), "--",
               *jupyter_server.root_flag()]
    with jupyter_server.running(command, port, tmp_path, log) as base:
        token = jupyter_server.TOKEN
        status, location, _ = jupyter_server.get(f"{base}/?token={token}")
        assert status == 302 and location.startswith("/lab/tree/00_lab.ipynb"), location
        status, _, body = jupyter_server.get(f"{base}/api/contents?token={token}")
        assert status == 200
        assert [c["name"] for c in json.loads(body)["content"]] == ["00_lab.ipynb"]
        assert jupyter_server.get(f"{base}/lab/tree/00_lab.ipynb?token={token}")[0] == 200
    assert f"JupyterLab on {folder}" in log.read_text()


@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs to run as root")
def test_lab_as_root_passes_allow_root_and_serves(tmp_path):
    """As root JupyterLab refuses to start unless told: `labdist lab` tells it, and says so."""
    folder = tmp_path / "served"
    folder.mkdir()
    port, log = jupyter_server.free_port(), tmp_path / "lab.log"
    command = [*LABDIST, "lab", str(folder), "--no-browser", "--port", str(port)]
    with jupyter_server.running(command, port, tmp_path, log) as base:
        status, _, body = jupyter_server.get(f"{base}/api/contents?token={jupyter_server.TOKEN}")
        assert status == 200 and json.loads(body)["content"] == []
    assert "Running as root: passing --allow-root to JupyterLab" in log.read_text()


def test_root_flags_only_for_root_and_only_once():
    from labdist.cli.lab import root_flags

    assert root_flags([], euid=0) == ["--allow-root"]
    assert root_flags(["--allow-root"], euid=0) == []
    assert root_flags(["--ServerApp.allow_root=True"], euid=0) == []
    assert root_flags([], euid=1000) == []


def test_lab_without_a_notebook_00_opens_jupyterlab_itself(tmp_path):
    from labdist.cli.lab import lab_command, notebooks_dir

    assert notebooks_dir() == NOTEBOOKS
    command = lab_command(tmp_path, 8123, True, ["--allow-root"])
    assert command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={tmp_path}" in command
    assert not any("default_url" in c for c in command)  # no lab notebook: JupyterLab's home
    assert command[-3:] == ["--ServerApp.port=8123", "--no-browser", "--allow-root"]
