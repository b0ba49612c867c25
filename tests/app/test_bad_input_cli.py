"""The command line refuses values it cannot honour, in one line on stderr, before it starts
anything: a port outside 1..65535, an empty output folder, more replicas than the machine
holds, a batch larger than the run's data, more parameter servers than workers, and a run
whose loss diverged is not reported as a success."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_cli import LABDIST, assert_one_line_error, labdist


def in_folder(folder, *args: str):
    environ = {k: v for k, v in os.environ.items() if k != "LABDIST_SCHEDULER"}
    environ["PYTHONPATH"] = os.pathsep.join([os.getcwd(), environ.get("PYTHONPATH", "")])
    return subprocess.run([*LABDIST, *args], capture_output=True, text=True, timeout=60,
                          cwd=folder, env=environ, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_lab_port_must_be_a_tcp_port(port):
    """Before: --port 70000 printed http://127.0.0.1:70000 while Jupyter listened elsewhere."""
    assert_one_line_error(labdist("lab", "--port", port, "--no-browser", timeout=60), 2,
                          "--port", port, "use a TCP port in 1..65535")


def test_demo_out_empty_is_refused_and_writes_nothing(tmp_path):
    """Before: --out '' wrote the chart and report into the current folder."""
    result = in_folder(tmp_path, "demo", "--out", "", "--steps", "1")
    assert_one_line_error(result, 1, "--out ''", "is not allowed; use a path")
    assert list(tmp_path.iterdir()) == []


def test_demo_with_more_replicas_than_the_machine_holds_starts_nothing(tmp_path):
    start = time.monotonic()
    result = in_folder(tmp_path, "demo", "--replicas", "1000000")
    assert_one_line_error(result, 1, "--replicas 1000000 asks an embedded cluster for 1000000 "
                                     "worker processes", "CPU(s)", "allowed: at most")
    assert time.monotonic() - start < 30
    assert list(tmp_path.iterdir()) == []  # not even the output folder
    assert "Starting" not in result.stdout


def test_run_batch_larger_than_its_data_is_refused_before_connecting():
    """Before: --batch-size 1000000000 died in a 7 GiB allocation traceback. The address is
    never tried: the refusal comes first."""
    result = labdist("run", "--scheduler", "tcp://127.0.0.1:1", "--batch-size", "1000000000",
                     timeout=60)
    assert_one_line_error(result, 1, "--batch-size 1000000000 is not allowed; use 1..8192",
                          "8192 examples")


@pytest.mark.parametrize("rate", ["inf", "nan", "-inf", "0"])
def test_run_learning_rate_must_be_finite_and_positive(rate):
    result = labdist("run", "--scheduler", "tcp://127.0.0.1:1", f"--learning-rate={rate}",
                     timeout=60)
    assert_one_line_error(result, 2, "--learning-rate", "use a finite number > 0")


@pytest.mark.cluster
def test_run_refuses_more_parameter_servers_than_workers_and_a_diverged_run(external):
    """Before: --num-ps 1000 on 2 workers placed 1000 parameter servers round-robin and
    exited 0, and --learning-rate 1e30 ended with `loss nan`, exit 0."""
    result = labdist("run", "--scheduler", external.address, "--strategy", "parameter-server",
                     "--num-ps", "1000", "--connect-timeout", "2", timeout=90)
    assert_one_line_error(result, 1, "num_ps=1000 but the cluster has 2 worker(s)",
                          "allowed: at most 2")
    result = labdist("run", "--scheduler", external.address, "--learning-rate", "1e30",
                     "--steps", "10", timeout=120)
    assert_one_line_error(result, 1, "training diverged: loss nan",
                          "--learning-rate 1e+30; use a smaller learning rate")
    assert external.alive()


def test_run_help_still_lists_the_bounds():
    out = subprocess.run([*LABDIST, "lab", "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0 and "--port" in out.stdout
    assert sys.executable  # (the same interpreter runs the command line)
