"""`labdist demo`: the demo experiment (labdist/demo.py) plus its PNG chart and HTML report."""

from __future__ import annotations

from labdist.cli.mistakes import UserError
from labdist.cli.paths import output_folder, write_atomically

CHART, REPORT = "demo.png", "report.html"


def demo(replicas: int, steps: int, out: str) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("matplotlib is needed for the demo's chart: pip install matplotlib") \
            from None
    from labdist.cli.report import chart, page
    from labdist.cluster.capacity import check_local_workers
    from labdist.demo import run_demo

    try:  # before the output folder is made and before any worker starts
        check_local_workers(replicas, f"--replicas {replicas}")
    except ValueError as e:
        raise UserError(str(e)) from None

    with output_folder("--out", out) as out_dir:  # checked before the run, not after it
        figures = run_demo(num_replicas=replicas, steps=steps,
                           say=lambda line: print(line, flush=True))
        png = write_atomically(out_dir / CHART, lambda path: chart(figures["traces"], path))
        report = write_atomically(out_dir / REPORT,
                                  lambda path: page(figures, out_dir / CHART, path))
    print(f"Chart:  {png}\nReport: {report}")
    return 0
