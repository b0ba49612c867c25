"""bench/bench_train.py's own machinery, so the bench cannot rot silently: a runner really
runs in its own process and its JSON line is read, configurations without an interpreter are
reported as not measured, and the target table compares the right figures. Needs neither
torch nor TensorFlow (their runners are not started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_train as bt  # noqa: E402


def tiny(rounds: int = 1) -> bt.Settings:
    return bt.Settings(rounds=rounds, passes=1, warmup=1, steps={64: 3, 256: 2}, timeout=60.0)


def test_the_numpy_runner_runs_in_its_own_process_and_reports_json():
    """Both batches of the numpy baseline, one process each; torch and TF configurations are
    not started without their interpreters, and say how to measure them."""
    pythons = {"numpy": sys.executable, "labdist": sys.executable, "torch": None, "tf": None}
    configs = [bt.BY_KEY["numpy"], bt.BY_KEY["torch_ddp"], bt.BY_KEY["tf_loop_1"]]
    runs = bt.run_rounds(configs, pythons, tiny(), k_steps=False, log=lambda *a, **k: None)
    measured = [r for r in runs if r.steps_per_s is not None]
    assert sorted(r.batch for r in measured) == [64, 256]
    assert all(r.key == "numpy" and r.steps_per_s > 0 and r.seconds > 0 for r in measured)
    assert all(r.info["pid"] for r in measured)  # the runner's own process said so
    assert len({r.info["pid"] for r in measured}) == 2
    skipped = {r.key: r.error for r in runs if r.steps_per_s is None}
    assert "LABDIST_BENCH_TORCH_PY" in skipped["torch_ddp"]
    assert "LABDIST_BENCH_TF_PY" in skipped["tf_loop_1"]
    figures = bt.medians(runs)
    assert figures["torch_ddp"] == {64: None, 256: None}
    info = {"nproc": 2, "cpu_model": "x", "python": "3", "numpy": "2", "git": "abc",
            "loadavg_at_start": (0.0, 0.0, 0.0), "cpu_use": {"others_share": 0.0},
            "others_median": 0.0, "others_max": 0.0}
    report = bt.format_report(runs, figures, bt.evaluate(bt.TARGETS, figures), info)
    assert "not measured: set LABDIST_BENCH_TORCH_PY" in report
    assert "fit >= 1.5x torch DDP (gloo), 2 replicas, batch 64" in report


def test_a_failing_runner_is_a_run_with_its_reason():
    config = bt.Config("numpy", "numpy", "numpy", "no_such_runner.py")
    run = bt.run_one(config, sys.executable, 64, 0, tiny())
    assert run.steps_per_s is None and "no JSON result (exit 2)" in run.error
    assert "no_such_runner.py" in run.error  # the runner's last line of stderr


def test_parse_output_takes_the_last_json_line():
    out = 'warming up\n{"not": "this"}\nlog {\n{"steps_per_s": 12.5, "info": {}}\n'
    assert bt.parse_output(out)["steps_per_s"] == 12.5
    with pytest.raises(ValueError):
        bt.parse_output("no result\n")


def test_medians_are_over_the_rounds_that_measured():
    runs = [bt.Run("fit_10", 64, r, v) for r, v in enumerate([100.0, 300.0, 200.0, None])]
    assert bt.medians(runs) == {"fit_10": {64: 200.0}}


def test_targets_compare_the_best_of_each_side():
    figures = {"fit_1": {64: 100.0, 256: 50.0}, "fit_10": {64: 200.0, 256: 60.0},
               "torch_ddp": {64: 100.0, 256: 50.0}, "numpy": {64: 400.0, 256: 70.0},
               "torch_one": {64: 300.0, 256: 80.0}, "loop_1": {64: 90.0},
               "loop_10_pipes": {64: 240.0},
               "tf_loop_1": {64: 60.0}, "tf_loop_10": {64: 150.0, 256: None}}
    rows = {(r["target"]): r for r in bt.evaluate(bt.TARGETS, figures)}
    ddp64 = rows["fit >= 1.5x torch DDP (gloo), 2 replicas, batch 64"]
    assert ddp64["ratio"] == pytest.approx(2.0) and ddp64["verdict"] == "PASS"
    assert ddp64["of"] == "fit_10 / torch_ddp"
    ddp256 = rows["fit >= 1.5x torch DDP (gloo), 2 replicas, batch 256"]
    assert ddp256["ratio"] == pytest.approx(1.2) and ddp256["verdict"] == "FAIL"
    one256 = rows["fit >= 0.8x one process (numpy or torch, the faster), batch 256"]
    assert one256["ratio"] == pytest.approx(60 / 80) and one256["of"] == "fit_10 / torch_one"
    loop = rows["fit >= the custom loop (run per step), batch 64"]
    assert loop["ratio"] == pytest.approx(200 / 90) and loop["verdict"] == "PASS"
    tf1 = rows["custom loop (run per step) >= 1.5x TF's custom loop at 1 step/call, batch 64"]
    assert tf1["ratio"] == pytest.approx(1.5) and tf1["verdict"] == "PASS"  # at the bound
    k10 = rows["custom loop, steps=10 >= 0.6x one process, batch 64"]
    assert k10["of"] == "loop_10_pipes / numpy" and k10["verdict"] == "PASS"
    tf_best = rows["fit >= 1.2x TF's custom loop (best of 1, 10 steps/call), batch 64"]
    assert tf_best["of"] == "fit_10 / tf_loop_10"
    missing = rows["fit >= 1.2x TF's custom loop (best of 1, 10 steps/call), batch 256"]
    assert missing["verdict"] == "not measured" and "tf_loop_1/tf_loop_10" in missing["of"]


def test_before_and_after_pairs_are_ratios_within_a_round(tmp_path):
    runs = [bt.Run("fit_1", 64, 0, 300.0), bt.Run("fit_1_before", 64, 0, 200.0),
            bt.Run("fit_1", 64, 1, 100.0), bt.Run("fit_1_before", 64, 1, 100.0),
            bt.Run("fit_1", 64, 2, 200.0), bt.Run("fit_1_before", 64, 2, None)]
    [row] = bt.paired(runs)
    assert row["ratio"] == pytest.approx(1.25) and row["pairs"] == [1.5, 1.0]
    pythons = {"labdist": sys.executable, "before": None}
    assert "LABDIST_BENCH_BEFORE" in bt.not_measured(bt.BY_KEY["fit_1_before"], pythons, True)
    pythons["before"] = str(tmp_path)
    assert bt.not_measured(bt.BY_KEY["fit_1_before"], pythons, True) is None


def test_the_k_steps_configuration_waits_for_the_api():
    pythons = {"labdist": sys.executable}
    assert "no steps=" in bt.not_measured(bt.BY_KEY["loop_10"], pythons, k_steps=False)
    assert bt.not_measured(bt.BY_KEY["loop_10"], pythons, k_steps=True) is None
    assert bt.not_measured(bt.BY_KEY["loop_1"], pythons, k_steps=False) is None


@pytest.mark.parametrize("key", ["fit_10", "loop_1", "loop_10", "loop_10_pipes"])
def test_labdist_runners_train_for_real(key):
    """labdist's own runners start a cluster in their own process and report a rate: a runner
    whose API use rots (as loop_10 once passed a plain generator to steps=) fails here."""
    settings = bt.Settings(rounds=1, passes=1, warmup=10, steps={64: 20, 256: 10}, timeout=120.0)
    run = bt.run_one(bt.BY_KEY[key], sys.executable, 64, 0, settings)
    assert run.error is None and run.steps_per_s > 0, run.error
    assert run.info["transport"] == "shm"


def _inner(n: int) -> int:
    return sum(range(n))


def _outer(n: int) -> int:
    return _inner(n) + _inner(n)


def test_spans_split_exclusive_time_and_leave_nothing_behind():
    """The profile's spans (bench/_spans.py): a span's exclusive time excludes the spans it
    called, and uninstall puts back the very same functions (so plain runs pay nothing)."""
    import _spans

    module = sys.modules[__name__]
    originals = (_inner, _outer)
    missing = _spans.install([(f"{__name__}:_outer", "outer"), (f"{__name__}:_inner", "inner"),
                              (f"{__name__}:_absent", "absent")])
    try:
        assert missing == [f"{__name__}:_absent"]
        _spans.reset()
        assert module._outer(20000) == 2 * sum(range(20000))
        table = _spans.snapshot()["threads"]
        mine = next(t for t in table.values() if "outer" in t)
    finally:
        _spans.uninstall()
    assert (module._inner, module._outer) == originals
    outer_excl, outer_incl, outer_calls = mine["outer"]
    inner_excl, inner_incl, inner_calls = mine["inner"]
    assert (outer_calls, inner_calls) == (1, 2)
    assert inner_excl == inner_incl and outer_incl >= inner_incl
    assert outer_excl == outer_incl - inner_incl


def test_the_scale_bench_judges_issue_26_s_replica_count_targets():
    import bench_scale

    figures = {"fit 784-512-10 x2": 100.0, "fit 784-512-10 x4": 80.0,
               "fit 784-512-10 x8": 40.0, "trivial run x2": 300.0, "trivial run x8": 600.0,
               "1 MB all-reduce x2": 0.2, "1 MB all-reduce x8": 0.7,
               "1 MB all-reduce floor x8": 0.22,
               "ddp 784-512-10 x2": 50.0, "ddp 784-512-10 x4": None}
    lines = {line.split("  ")[0]: line for line in bench_scale.targets(figures)[1:]}
    assert lines["fit at 4 replicas >= 0.75x its rate at 2"].endswith("0.80x  PASS")
    assert lines["fit at 8 replicas >= 0.5x its rate at 2"].endswith("0.40x  FAIL")
    assert lines["trivial strategy.run at 8 <= 2x its time at 2"].endswith("2.00x  PASS")
    assert lines["1 MB all-reduce at 8 <= 3x its time at 2"].endswith("3.50x  FAIL")
    # the memory work alone at 8 against the all-reduce at 2: whether 3x can be met at all
    assert lines["floor at 8 <= 3x all-reduce at 2 (possible?)"].endswith("1.10x  PASS")
    assert lines["fit >= 1.5x torch DDP at 2 replicas, batch 256"].endswith("2.00x  PASS")
    assert lines["fit >= 1.5x torch DDP at 4 replicas, batch 256"].endswith("not measured")
