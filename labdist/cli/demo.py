"""`labdist demo`: the demo experiment (labdist/demo.py) plus its PNG chart and HTML report."""

from __future__ import annotations

from pathlib import Path

from labdist.cli.errors import UserError

CHART, REPORT = "demo.png", "report.html"


def demo(replicas: int, steps: int, out: str) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("matplotlib is needed for the demo's chart: pip install matplotlib") \
            from None
    out_dir = Path(out).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out!r} exists and is not a folder")
    from labdist.cli.report import chart, page
    from labdist.demo import run_demo

    figures = run_demo(num_replicas=replicas, steps=steps,
                       say=lambda line: print(line, flush=True))
    png = chart(figures["traces"], out_dir / CHART)
    report = page(figures, png, out_dir / REPORT)
    print(f"Chart:  {png}\nReport: {report}")
    return 0
