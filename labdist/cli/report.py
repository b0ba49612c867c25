"""The demo's report: a PNG chart of every replica's copy of a weight, step by step (equal
under MEAN, each on its own path under NONE), and a self-contained HTML page around it.

matplotlib's object API (Figure + Agg canvas) draws without pyplot's global state or a display.
"""

from __future__ import annotations

import base64
import contextlib
import html
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

TRUE_W = 3.0  # the demo fits y = 3x - 2
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")


def chart(traces: list[dict], path: Path) -> Path:
    """Draw the traces (one panel per experiment, plus the loss) into a PNG at `path`."""
    fig = figure(traces)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def figure(traces: list[dict]):
    """The chart as a matplotlib Figure; its step axis counts from 1, as the demo prints."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * (len(traces) + 1), 3.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(traces) + 1, sharex=True)
    for ax, trace in zip(axes, traces, strict=False):
        per_replica = list(zip(*trace["w"], strict=True))  # one series per replica
        for r, series in enumerate(per_replica):
            ax.plot(range(1, len(series) + 1), series, color=COLORS[r % len(COLORS)],
                    linewidth=2.5 if r == 0 else 1.5, linestyle="-" if r == 0 else "--",
                    label=f"replica {r}")
        ax.axhline(TRUE_W, color="grey", linestyle=":", linewidth=1, label="true w")
        ax.set_title(f"aggregation {trace['aggregation']}: copies of w "
                     f"(spread {trace['spread']:.3g})", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("w")
        ax.legend(fontsize=8, loc="best")
    loss_ax = axes[-1]
    for trace, style in zip(traces, ("-", "--", ":"), strict=False):
        loss_ax.plot(range(1, len(trace["loss"]) + 1), trace["loss"], linestyle=style,
                     label=f"{trace['aggregation']}")
    loss_ax.set_title("loss, each replica on its own shard (mean)", fontsize=10)
    loss_ax.set_xlabel("step")
    loss_ax.legend(fontsize=8)
    return fig


def _versions() -> str:
    found = []
    for name in ("labdist", "numpy", "dask", "distributed", "matplotlib"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found) + f"; python {platform.python_version()}"


def _cell(value) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def page(figures: dict, png: Path, path: Path) -> Path:
    """A single HTML file (the chart embedded, no network needed) describing the run."""
    rows = []
    for row in figures["table"]:
        # differing copies are the point of ON_READ, and a divergence under ON_WRITE
        style = ("equal" if len(set(row["copies"])) == 1 else
                 "local" if row["synchronization"] == "ON_READ" else "diverged")
        rows.append("<tr>" + _cell(row["synchronization"]) + _cell(row["aggregation"])
                    + f"<td class={style}>"
                    + html.escape(", ".join(f"{c:g}" for c in row["copies"])) + "</td>"
                    + _cell(row["read"])
                    + _cell("ReplicaDivergenceWarning" if row.get("warning") else "") + "</tr>")
    finals = []
    for trace in figures["traces"]:
        last = ", ".join(f"{w:.3f}" for w in trace["w"][-1])
        finals.append("<tr>" + _cell(trace["aggregation"]) + _cell(len(trace["w"]))
                      + _cell(last)
                      + _cell(f"{trace['spread']:.3g}") + _cell(f"{trace['loss'][-1]:.4f}")
                      + "</tr>")
    warnings = [(t["aggregation"], t["warning"]) for t in figures["traces"] if t.get("warning")]
    warned = "".join(
        f" (with {html.escape(agg)}, labdist warned: <code>ReplicaDivergenceWarning</code>: "
        f"{html.escape(message)} TensorFlow stays silent)" for agg, message in warnings)
    image = base64.b64encode(png.read_bytes()).decode()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017
    text = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>labdist demo report</title>
<style>
 body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222 }}
 table {{ border-collapse: collapse; margin: 1em 0 }}
 td, th {{ border: 1px solid #ccc; padding: .25em .6em; text-align: left }}
 th {{ background: #f3f3f3 }}
 td.diverged {{ background: #fde2e1 }} td.equal {{ background: #e3f6e3 }}
 td.local {{ background: #fff6d6 }}
 img {{ max-width: 100% }} .muted {{ color: #777; font-size: .9em }}
</style></head><body>
<h1>labdist demo</h1>
<p>{figures['num_replicas']} replicas, one per Dask worker process ({html.escape(
    ', '.join(figures['workers']))}); {figures['steps']} SGD steps per experiment;
{figures['seconds']:.1f} s in all.</p>
<h2>1. Synchronization &times; aggregation</h2>
<p>Each replica calls <code>assign_add(replica id + 1)</code> on a variable starting at 10
inside <code>strategy.run</code>. <code>ON_WRITE</code> all-reduces the update when it is
written (copies stay equal, unless the aggregation is <code>NONE</code>);
<code>ON_READ</code> keeps each replica's own copy and aggregates when the driver reads.</p>
<table><tr><th>synchronization</th><th>aggregation</th><th>copies after the update</th>
<th>cross-replica read</th><th>labdist warned</th></tr>
{''.join(rows)}
</table>
<h2>2. Training: copies equal with MEAN, each on its own path with NONE</h2>
<p>Each replica fits <code>y = 3x - 2</code> on its own region of x. With aggregation
<code>MEAN</code> the updates are averaged when written and every copy of <code>w</code> takes
the same step; with <code>NONE</code> each copy follows its own shard, so they part at the
first step and head for the line along their own paths{warned}. Step <i>n</i> shows the
copies of <code>w</code> after the <i>n</i>-th update and the loss on that step's batch. The
parted copies' loss is lower only because each is measured on the shard it overfits: none of
them is the model of the whole data.</p>
<img alt="every replica's copy of w per step, and the loss" src="data:image/png;base64,{image}">
<table><tr><th>aggregation</th><th>step</th><th>final w per replica</th><th>spread</th>
<th>loss</th></tr>
{''.join(finals)}
</table>
<p class="muted">Chart also saved as {html.escape(png.name)}. {html.escape(_versions())};
{when}.</p>
</body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
