"""The panel's part for the communication modes (compression, local SGD / DiLoCo): their
controls, and three line charts fed from each step's `communication` summary — bytes each
replica sent, each replica's error-feedback residual norm, and DiLoCo's pseudo-gradient and
outer step (norms of the last round closed: a step line that moves when a round closes)."""

from __future__ import annotations

from collections.abc import Collection

import ipywidgets as w

from labdist.lab.config import COMPRESSIONS, RunConfig
from labdist.lab.run_items import StepItem
from labdist.ui.line_chart import LineChart

WIDE = w.Layout(width="262px")  # inside the section's padding
STYLE = {"description_width": "112px"}
NAMES = ("bytes", "residual", "outer")
NAN = float("nan")


def make_charts(lab) -> dict[str, LineChart]:
    # quorum mode: room for the replicas add_replica may add (the panel hides empty slots)
    replicas = [f"replica {r}" for r in range(lab.replica_slots)]
    return {
        "bytes": LineChart(title="bytes each replica sent per step", y_label="bytes",
                           series=replicas, zero_y=True),
        "residual": LineChart(title="error-feedback residual norm, each replica",
                              y_label="‖residual‖", series=replicas, zero_y=True),
        "outer": LineChart(title="DiLoCo: pseudo-gradient and outer step (last round)",
                           y_label="norm", series=["‖pseudo-gradient‖", "‖outer step‖"],
                           colors=["#6a3d9a", "#e6550d"], zero_y=True),
    }


def captions(config: RunConfig) -> dict[str, str]:
    off = ("off: set a compressor or local steps (mirrored ON_WRITE, MEAN or SUM) to "
           "fill it")
    if config.kind.is_ps:
        return {"bytes": "mirrored only: parameter servers' pulls and pushes are not shown",
                "residual": off, "outer": off}
    if not config.communicates_less:
        return {"bytes": ("uncompressed: what each replica sent its peers this step — the "
                          "baseline a compressor saves against"), "residual": off,
                "outer": off}
    comp = config.compression
    return {
        "bytes": (f"{comp}: what each replica sent its peers this step" if comp != "none"
                  else "uncompressed all-reduce bytes") + _cost(comp) +
                 (f"; local SGD: 0 on inner steps, a burst every {config.local_steps}"
                  if config.local_steps else ""),
        "residual": ("what compression dropped and will send with the next gradient (error "
                     "feedback); each replica keeps its own" if comp not in ("none", "fp16",
                                                                            "bf16")
                     else f"{comp}: only rounding is dropped — tiny residuals"),
        "outer": (f"every {config.local_steps} steps the replicas average their weight change"
                  " (pseudo-gradient); the outer step applies it with momentum — the spread"
                  " snaps to 0 then" if config.local_steps else "local SGD off"),
    }


class Feed:
    """Turns step rows into the three charts' appends (plain rows: gaps)."""

    def __init__(self, charts: dict[str, LineChart], n: int):
        self.charts, self.n = charts, n
        self._outer: tuple[float, float] = (NAN, NAN)

    def _per_slot(self, values) -> list[float]:
        """One value per replica slot: a quorum lab with a replica lost (or not yet added)
        sends fewer, and a step that sent nothing sends none; the missing ones are gaps."""
        return (list(values or []) + [NAN] * self.n)[:self.n]

    def append(self, rows: list[StepItem]) -> None:
        x = [r.step for r in rows]
        comm = [r.communication for r in rows]
        sent = [r.sent for r in rows]  # every mirrored step's, compressed or not
        self.charts["bytes"].append(x, _columns([self._per_slot(b) for b in sent]))
        self.charts["residual"].append(x, _columns([self._per_slot(c and c["residual_norm"])
                                                    for c in comm]))
        outer = []
        for c in comm:
            if c is None:
                self._outer = (NAN, NAN)
            elif c["pseudo_norm"] is not None:
                self._outer = (c["pseudo_norm"], c["outer_norm"])
            outer.append(self._outer)
        self.charts["outer"].append(x, _columns(outer))


def _cost(comp: str) -> str:
    """When a compressor cannot pay, in words: what it sends besides the values."""
    if comp == "topk":
        return (" (each kept value travels with its index: on a model of a few parameters "
                "that is more than the uncompressed step; it pays on large gradients)")
    if comp == "powersgd":
        return (" (two low-rank factors per matrix: on a tiny or vector-shaped model about "
                "what the uncompressed step sends; it pays on large matrices)")
    return ""


def _columns(per_step: list) -> list[list]:
    return [list(col) for col in zip(*per_step, strict=True)]


class Controls:
    """Compressor and its parameter, local steps H, outer learning rate and momentum; bound
    through the lab controls' `changed` / `quiet` (a shown value is not sent back)."""

    def __init__(self, changed, quiet):
        self.compression = w.Dropdown(
            options=list(COMPRESSIONS), description="compression", style=STYLE, layout=WIDE,
            tooltip="the gradient all-reduce's compressor")
        # a number box, not a log slider: one drawn while the section is closed shows its
        # minimum once opened
        self.topk_ratio = w.BoundedFloatText(value=0.01, min=1e-4, max=1.0, step=0.005,
                                             description="top-k ratio", style=STYLE,
                                             layout=WIDE)
        self.powersgd_rank = w.IntSlider(value=1, min=1, max=8, description="PowerSGD rank",
                                         style=STYLE, layout=WIDE)
        self.local_steps = w.IntSlider(value=0, min=0, max=64, description="local steps H",
                                       tooltip="DiLoCo: steps each replica takes alone "
                                       "between synchronisations (0: off)", style=STYLE,
                                       layout=WIDE)
        self.outer_lr = w.FloatSlider(value=0.7, min=0.05, max=2.0, step=0.05,
                                      description="outer lr", style=STYLE, layout=WIDE)
        self.outer_momentum = w.FloatSlider(value=0.9, min=0.0, max=0.99, step=0.01,
                                            description="momentum", style=STYLE,
                                            tooltip="the outer optimizer's Nesterov momentum",
                                            layout=WIDE)
        self._quiet = quiet
        for name in ("compression", "topk_ratio", "powersgd_rank", "local_steps", "outer_lr",
                     "outer_momentum"):
            widget = getattr(self, name)
            widget.add_class(f"labdist-{name.replace('_', '-')}")
            if hasattr(widget, "continuous_update"):
                widget.continuous_update = False
            widget.observe(changed(name), names="value")

    def sync(self, config: RunConfig, fields: Collection[str] | None) -> None:
        """Show `config` (the caller holds the controls quiet)."""
        for name in ("compression", "topk_ratio", "powersgd_rank", "local_steps", "outer_lr",
                     "outer_momentum"):
            if fields is None or name in fields:
                widget = getattr(self, name)
                value = getattr(config, name)
                if hasattr(widget, "max"):
                    value = min(value, widget.max)
                widget.value = value
        off = config.kind.is_ps
        for name in ("compression", "topk_ratio", "powersgd_rank", "local_steps", "outer_lr",
                     "outer_momentum"):
            getattr(self, name).disabled = off
        self.topk_ratio.disabled = off or config.compression != "topk"
        self.powersgd_rank.disabled = off or config.compression != "powersgd"
        self.outer_lr.disabled = self.outer_momentum.disabled = off or not config.local_steps

    def widgets(self) -> list[w.Widget]:
        """One closed section: the column above still fits beside the lead chart at
        1280 x 800; opened, it shows the six controls."""
        box = w.VBox([self.compression, self.topk_ratio, self.powersgd_rank, self.local_steps,
                      self.outer_lr, self.outer_momentum])
        self.section = w.Accordion(children=[box], selected_index=None,
                                   layout=w.Layout(width="300px"))
        self.section.set_title(0, "less communication (mirrored ON_WRITE)")
        self.section.add_class("labdist-communication")
        return [self.section]
