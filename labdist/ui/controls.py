"""The lab's controls (ipywidgets). An observer only calls `lab.set(...)` / `lab.run(...)`,
which queue under a lock and return at once: nothing here runs training code, so the controls
work the same whether widget messages arrive on the kernel's main shell or on a subshell
(JupyterLab's commsOverSubshells)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

import ipywidgets as w

from labdist.lab.config import AGGREGATIONS, Kind, RunConfig
from labdist.ui import communication_controls, network_controls

KIND_OPTIONS = [(k.label, k.value) for k in Kind]
AGG_LABELS = {"ONLY_FIRST_REPLICA": "FIRST"}
WIDE = w.Layout(width="290px")
STYLE = {"description_width": "110px"}


class _Quiet(threading.local):
    """Set while `sync()` writes values on this thread: the observers then stay silent."""

    on = False


def _toggle(name: str, options, tooltip: str, width: str) -> w.ToggleButtons:
    """Buttons under their own heading (a description beside them leaves no room)."""
    t = w.ToggleButtons(options=options, tooltip=tooltip,
                        style={"button_width": width, "description_width": "0px"},
                        layout=w.Layout(width="300px"))
    t.add_class(f"labdist-{name}")
    return t


class Controls:
    """The widgets, bound to a lab; `sync(config)` shows a configuration without echoing it
    back as a change."""

    def __init__(self, lab):
        self.lab = lab
        self.error: str | None = None
        self.on_error: Callable[[str], None] | None = None  # told each refusal's text
        self._quiet = _Quiet()
        n = lab.replica_slots  # quorum: a slider for each replica add_replica may add
        self.kind = _toggle("kind", KIND_OPTIONS, "mirrored or parameter servers", "90px")
        self.synchronization = _toggle("synchronization", ["ON_WRITE", "ON_READ", "NONE"],
                                       "when the copies agree", "90px")
        self.aggregation = _toggle(
            "aggregation", [(AGG_LABELS.get(a, a), a) for a in AGGREGATIONS],
            "how the replicas' updates (ON_WRITE) or gradients (PS sync) combine", "66px")
        self.learning_rate = w.FloatLogSlider(value=0.05, base=10, min=-4, max=1, step=0.1,
                                              description="learning rate", style=STYLE,
                                              layout=WIDE, readout_format=".3g")
        self.skew = w.FloatSlider(value=0.0, min=0.0, max=5.0, step=0.1,
                                  description="data skew", style=STYLE, layout=WIDE)
        self.delays = [w.FloatSlider(value=0.0, min=0.0, max=0.5, step=0.01,
                                     description=f"delay {r} (s)", style=STYLE,
                                     layout=w.Layout(width=WIDE.width),  # hidden one by one
                                     tooltip=f"a straggler: replica / worker {r} waits this "
                                     "long each step")
                       for r in range(n)]
        self.use_locking = w.Checkbox(value=False, description="use_locking (PS)",
                                      style=STYLE, layout=WIDE)
        self.synchronized_bn = w.Checkbox(
            value=False, description="synchronized batch norm", style=STYLE,
            layout=w.Layout(width=WIDE.width),  # its own: hidden for models without state
            tooltip="sum batch norm's statistics across the replicas every step (Keras' "
            "synchronized=True): the moving statistics stop drifting apart")
        if not lab.spec.state_names:  # the model has no batch norm: nothing to synchronize
            self.synchronized_bn.layout.display = "none"
        self.sync_period = w.IntSlider(value=10, min=0, max=50, description="ON_READ period",
                                       style=STYLE, layout=WIDE)
        self.resync = _toggle("resync", [("average", "average"), ("replica 0", "first")],
                              "how differing copies become one on a switch", "90px")
        self.pace = w.IntSlider(value=0, min=0, max=200, step=5,
                                description="pace (steps/s)", style=STYLE, layout=WIDE)
        self.apply_delay = w.FloatSlider(
            value=2.0, min=0.0, max=20.0, step=0.5, description="apply delay (ms)",
            tooltip="PS: how long a parameter server holds each chunk of an update before "
            "writing it; wider windows make races (torn reads, lost updates) likelier",
            style=STYLE, layout=WIDE)
        for slider in (self.learning_rate, self.skew, *self.delays, self.sync_period, self.pace,
                       self.apply_delay):
            slider.continuous_update = False  # one change when released, not one per pixel
        for name in ("learning_rate", "skew", "use_locking", "synchronized_bn", "sync_period",
                     "pace", "apply_delay"):
            getattr(self, name).add_class(f"labdist-{name.replace('_', '-')}")
        for r, slider in enumerate(self.delays):
            slider.add_class(f"labdist-delay-{r}")
        self.buttons = {label: w.Button(description=label, layout=w.Layout(width="68px"))
                        for label in ("run", "pause", "step", "reset")}
        for label, b in self.buttons.items():
            b.add_class(f"labdist-{label}")
        self.buttons["run"].button_style = "success"
        self._bind()
        self.communication = communication_controls.Controls(self._changed, self._quiet)
        self.network = network_controls.Controls(
            lambda **changes: self._safely(lambda: self.lab.set(**changes)), self._quiet)
        self.sync(lab.config)
        self.show_replicas(lab.num_replicas)

    def show_replicas(self, count: int) -> None:
        """Show the delay sliders of the `count` replicas there are (quorum: the rest wait,
        hidden, for replicas added later)."""
        for r, slider in enumerate(self.delays):
            slider.layout.display = "" if r < count else "none"

    def _bind(self) -> None:
        for name in ("kind", "synchronization", "aggregation", "learning_rate", "skew",
                     "use_locking", "synchronized_bn", "sync_period", "resync", "pace",
                     "apply_delay"):
            getattr(self, name).observe(self._changed(name), names="value")
        for r, slider in enumerate(self.delays):
            slider.observe(self._changed_delay(r), names="value")
        lab = self.lab
        actions = {"run": lambda: lab.run(), "pause": lambda: lab.pause(wait=False),
                   "step": lambda: lab.run(1), "reset": lambda: lab.reset(wait=False)}
        for label, action in actions.items():
            self.buttons[label].on_click(lambda _b, act=action: self._safely(act))

    def _changed(self, name: str):
        def observer(change: dict) -> None:
            if not self._quiet.on:
                value = change["new"]
                if name == "pace":
                    value = float(value)
                elif name == "apply_delay":  # shown in ms
                    value = float(value) / 1e3
                self._safely(lambda: self.lab.set(**{name: value}))
        return observer

    def _changed_delay(self, r: int):
        def observer(change: dict) -> None:
            if not self._quiet.on:
                self._safely(lambda: self.lab.set(delay={r: float(change["new"])}))
        return observer

    def _safely(self, action) -> None:
        """A refused change is shown in the panel's log, never raised into the kernel."""
        try:
            action()
            self.error = None
        except Exception as e:  # every refusal is reported the same way
            self.error = f"{type(e).__name__}: {e}"
            if self.on_error is not None:
                self.on_error(self.error)

    def sync(self, config: RunConfig, fields: Collection[str] | None = None) -> None:
        """Show `config` (from the publisher's thread) without queuing it again; `fields`:
        only these settings (those a change just applied). Writing the others could undo a
        click whose value reached the widget but not yet `lab.set` (another thread)."""
        values = {
            "kind": (self.kind, config.kind.value),
            "synchronization": (self.synchronization, config.synchronization.name),
            "aggregation": (self.aggregation, config.aggregation.name),
            "learning_rate": (self.learning_rate, config.learning_rate),
            "skew": (self.skew, min(config.skew, self.skew.max)),
            "use_locking": (self.use_locking, config.use_locking),
            "synchronized_bn": (self.synchronized_bn, config.synchronized_bn),
            "sync_period": (self.sync_period, min(config.sync_period, self.sync_period.max)),
            "resync": (self.resync, config.resync),
            "pace": (self.pace, int(min(config.pace, self.pace.max))),
            "apply_delay": (self.apply_delay,
                            min(config.apply_delay * 1e3, self.apply_delay.max)),
        }
        self._quiet.on = True
        try:
            for name, (widget, value) in values.items():
                if fields is None or name in fields:
                    widget.value = value
            if fields is None or "delays" in fields:
                for slider, d in zip(self.delays, config.delays, strict=False):  # n varies
                    slider.value = min(d, slider.max)
            mirrored = not config.kind.is_ps
            self.synchronization.disabled = not mirrored
            self.sync_period.disabled = not mirrored
            self.use_locking.disabled = mirrored
            self.apply_delay.disabled = mirrored
            self.communication.sync(config, fields)
            self.network.sync(config, fields)
        finally:
            self._quiet.on = False

    def widget(self) -> w.Widget:
        def section(text: str) -> w.HTML:
            return w.HTML(f"<div style='margin:6px 0 0 2px;font-weight:600'>{text}</div>")

        # headings above the buttons only (the buttons get the full width); the sliders say
        # what they are: the whole column fits beside the charts at 1280 x 800
        return w.VBox([
            w.HBox(list(self.buttons.values())),
            section("strategy"), self.kind, section("synchronization"), self.synchronization,
            section("aggregation"), self.aggregation,
            section("re-sync when copies must become one"), self.resync,
            self.sync_period, self.use_locking, self.synchronized_bn, self.apply_delay,
            self.learning_rate, self.skew, *self.delays, self.pace,
            *self.communication.widgets(), *self.network.widgets(),
        ], layout=w.Layout(width="300px"))

