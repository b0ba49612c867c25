"""The panel's network section: the latency and bandwidth of a slowed-down link
(`ld.NetworkModel` on every worker, applied at the next step boundary like every control), and
"off" for full speed. A slow link stretches a sync all-reduce (the timeline's `comm` bars grow)
while asynchronous parameter-server workers keep computing."""

from __future__ import annotations

from collections.abc import Callable, Collection

import ipywidgets as w

from labdist.lab.config import RunConfig, describe_rate

WIDE = w.Layout(width="262px")  # inside the section's padding
STYLE = {"description_width": "112px"}
# "unlimited" is 0 here (a Dropdown shows a None value as a blank box), None for the lab
BANDWIDTHS = [("unlimited", 0.0), ("1 GB/s", 1e9), ("100 MB/s", 1e8), ("10 MB/s", 1e7),
              ("1 MB/s", 1e6), ("100 KB/s", 1e5), ("10 KB/s", 1e4)]


class Controls:
    """Latency (ms), bandwidth, an "off" button; `send(**changes)` sets them on the lab (its
    refusals are the panel's to show), `quiet` holds the observers while `sync` shows a
    configuration."""

    def __init__(self, send: Callable[..., None], quiet):
        self._send, self._quiet = send, quiet
        self.latency = w.FloatSlider(value=0.0, min=0.0, max=100.0, step=1.0,
                                     description="latency (ms)", style=STYLE, layout=WIDE,
                                     continuous_update=False,
                                     tooltip="each message between workers takes this long "
                                     "more (0: none)")
        self.bandwidth = w.Dropdown(options=list(BANDWIDTHS), value=0.0,
                                    description="bandwidth", style=STYLE, layout=WIDE,
                                    tooltip="bytes per second of each worker's link")
        self.off = w.Button(description="off (full speed)", layout=w.Layout(width="140px"))
        for name in ("latency", "bandwidth", "off"):
            getattr(self, name).add_class(f"labdist-network-{name}")
        self.latency.observe(self._changed("latency", lambda v: float(v) / 1e3), names="value")
        self.bandwidth.observe(self._changed("bandwidth", lambda v: v or None), names="value")
        self.off.on_click(lambda _b: self._send(network=None))

    def _changed(self, name: str, convert: Callable):
        def observer(change: dict) -> None:
            if not self._quiet.on:
                self._send(**{name: convert(change["new"])})
        return observer

    def sync(self, config: RunConfig, fields: Collection[str] | None) -> None:
        """Show `config` (the caller holds the controls quiet)."""
        if fields is None or "latency" in fields:
            self.latency.value = min(config.latency * 1e3, self.latency.max)
        if fields is None or "bandwidth" in fields:
            shown = config.bandwidth or 0.0
            if shown not in [v for _, v in self.bandwidth.options]:
                self.bandwidth.options = [*self.bandwidth.options,
                                          (describe_rate(shown), shown)]
            self.bandwidth.value = shown

    def widgets(self) -> list[w.Widget]:
        """One closed section under the others."""
        box = w.VBox([self.latency, self.bandwidth, self.off])
        self.section = w.Accordion(children=[box], selected_index=None,
                                   layout=w.Layout(width="300px"))
        self.section.set_title(0, "network (a slow link)")
        self.section.add_class("labdist-network")
        return [self.section]
