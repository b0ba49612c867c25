"""`LabPanel`: what `lab.show()` displays — the controls, a status line with the Dask
dashboard link, the event log, and the live charts (per-replica traces of the tracked values,
replica spread, loss per replica and global, steps/s, the parameter servers' staleness
histogram, and for two-parameter models the parameter plane)."""

from __future__ import annotations

import html

import ipywidgets as w

from labdist.lab.config import Kind, RunConfig
from labdist.ui import communication_controls
from labdist.ui.controls import Controls
from labdist.ui.event_log import EventLog
from labdist.ui.histogram import Histogram
from labdist.ui.line_chart import DEFAULT_WINDOW, PALETTE, LineChart
from labdist.ui.parameter_plane import ParameterPlane
from labdist.ui.publisher import NO_PS_NOTE, Publisher, track_chart
from labdist.ui.replica_buttons import ReplicaButtons
from labdist.ui.timeline_chart import TimelineChart

# the charts that tell the current mode's story, first one on top (in view beside the
# controls at 1280 x 800 with JupyterLab's file browser open)
LEAD = {Kind.MIRRORED: ("plane", "spread"), Kind.PS_ASYNC: ("staleness", "throughput"),
        Kind.PS_SYNC: ("throughput", "staleness")}


BESIDE = "timeline"  # under the lead chart in every mode: where the time goes, in view


def arrangement(kind: Kind, names: list[str]) -> tuple[str, list[str]]:
    """(the chart on top, the others in order) for `kind`: its story first (the timeline,
    which has a place of its own under it, is in neither)."""
    names = [n for n in names if n != BESIDE]
    first = [n for n in LEAD[kind] if n in names]
    rest = first[1:] + [n for n in names if n not in first]
    return first[0], rest


def make_charts(lab) -> dict:
    n = lab.replica_slots  # quorum mode: room for the replicas add_replica may add
    replicas = [f"replica {r}" for r in range(n)]
    charts = {track_chart(lab.spec, name): LineChart(title=f"{name}, each replica's copy",
                                                     y_label=name, series=replicas)
              for name in lab.track}
    charts["spread"] = LineChart(title="replica spread (max distance of a copy to the mean)",
                                 y_label="spread", series=["spread"], colors=["#333333"])
    charts["loss"] = LineChart(title="loss per replica and global", y_label="loss",
                               series=[*replicas, "global"], colors=[*PALETTE[:n], "#000000"],
                               emphasis=n, log_y=True)
    charts["metric"] = LineChart(
        title="loss metric (a Mean, ON_READ / SUM): each replica's partial result and the "
        "cross-replica one, since the epoch began", y_label="mean loss",
        series=[*replicas, "cross-replica"], colors=[*PALETTE[:n], "#000000"], emphasis=n)
    charts["throughput"] = LineChart(title="throughput", y_label="steps / s",
                                     series=["steps / s"], colors=["#2b8a3e"], zero_y=True)
    charts["staleness"] = Histogram(
        title="parameter-server staleness", x_label="staleness (updates between read and "
        "apply)", y_label="updates",
        note=NO_PS_NOTE)
    charts["timeline"] = TimelineChart(title="where the time goes: each process's last steps")
    if lab.model.plane:
        a, b = lab.model.plane
        charts["plane"] = ParameterPlane(
            title=f"parameter plane: each replica's path over the loss ({a}, {b})",
            x_label=a, y_label=b, series=replicas, height=260)
    charts.update(communication_controls.make_charts(lab))
    for name, chart in charts.items():
        chart.add_class("labdist-" + name.replace(":", "-").replace("[", "-").replace("]", ""))
    return charts


class LabPanel:
    def __init__(self, lab):
        self.lab = lab
        self.charts = make_charts(lab)
        self.controls = Controls(lab)
        self.status = w.HTML("", layout=w.Layout(margin="0 16px 4px 4px"))
        self.status.add_class("labdist-status")
        self.log = EventLog()
        self.alert = w.HTML("", layout=w.Layout(display="none", border="2px solid #b00",
                                                padding="4px 8px", margin="0 0 6px 0"))
        self.alert.add_class("labdist-alert")
        link = lab.dashboard_link
        self.dashboard = w.HTML(
            f"<a href='{html.escape(link)}' target='_blank'>Dask dashboard</a>" if link
            else "no Dask dashboard for this cluster")
        self.dashboard.add_class("labdist-dashboard")
        self.controls.on_error = lambda text: self.log.append(f"refused: {text}")
        # the mode's lead chart on top, full width, the timeline right under it (both in view
        # at 1280 x 800 with the file browser open); the rest in two columns where they fit,
        # one where not; the charts go under the controls when the notebook is narrow
        self.lead = w.VBox([], layout=w.Layout(width="100%"))
        self.beside = w.VBox([self.charts[BESIDE]] if BESIDE in self.charts else [],
                             layout=w.Layout(width="100%"))
        self.grid = w.GridBox([], layout=w.Layout(grid_template_columns="repeat(auto-fit, "
                                                  "minmax(280px, 1fr))",
                                                  grid_gap="6px 10px", width="100%"))
        self.arrange(lab.config)
        right = w.VBox([self.status, self.alert, self.lead, self.beside, self.grid,
                        w.HTML("<b>events</b>"), self.log.widget],
                       layout=w.Layout(flex="1 1 480px", min_width="0", width="auto"))
        self.window = w.IntSlider(
            value=DEFAULT_WINDOW, min=0, max=2000, step=50, description="window (steps)",
            tooltip="the charts show the last this many steps (0: all); the y axis fits them",
            continuous_update=False, style={"description_width": "110px"},
            layout=w.Layout(width="290px"))
        self.window.add_class("labdist-window")
        self.window.observe(self._window_changed, names="value")
        self.replica_buttons = ReplicaButtons(lab, self.log.append) if lab.quorum else None
        left = w.VBox([self.controls.widget(), self.window,
                       *([self.replica_buttons.widget] if self.replica_buttons else []),
                       self.dashboard],
                      layout=w.Layout(flex="0 0 300px"))
        self.widget = w.HBox([left, right], layout=w.Layout(width="100%", flex_flow="row wrap",
                                                           grid_gap="0 10px"))
        self.widget.add_class("labdist-panel")
        self.publisher = Publisher(lab, self.charts, self.controls, self.status, self.log,
                                   self.alert, arrange=self.arrange)

    def arrange(self, config: RunConfig) -> None:
        """Put the chart that matters for `config`'s kind on top (a switch calls this)."""
        first, rest = arrangement(config.kind, list(self.charts))
        if self.lead.children != (self.charts[first],):
            self.lead.children = (self.charts[first],)
            self.grid.children = tuple(self.charts[n] for n in rest)

    def _window_changed(self, change: dict) -> None:
        for chart in self.charts.values():
            if isinstance(chart, LineChart):
                chart.window = int(change["new"])

    def close(self) -> None:
        self.publisher.close()
