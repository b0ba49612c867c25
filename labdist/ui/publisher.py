"""From the run to the charts, at most `RATE_HZ` times a second, on a thread of its own.

Its subscription to the lab (`lab.subscribe`) only puts items in a queue; this thread batches
them into deltas (all the steps since the last frame in one message per chart), draws events on
every chart, keeps the controls showing the configuration, and writes the event log
(ui/event_log.py: every line since the last reset).
"""

from __future__ import annotations

import html
import queue
import re
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from labdist.lab.config import describe_setting
from labdist.lab.run_items import (
    DivergedItem,
    ErrorItem,
    EventItem,
    PsStatsItem,
    ResetItem,
    RunItem,
    StepItem,
)
from labdist.ui import communication_controls
from labdist.ui.captions import captions

RATE_HZ = 20
STATUS_HZ = 5
TIMELINE_EVERY_S = 1.0  # the timeline gathers every process's phases: not every frame
GRID = 56  # the loss surface's resolution per axis
NO_PS_NOTE = ("0 updates · torn reads: 0 · lost updates: 0 (no parameter-server steps in "
              "this mode yet)")


class Publisher:
    def __init__(self, lab, charts: dict[str, Any], controls, status, log, alert=None,
                 arrange=None):
        self.lab = lab
        self.charts = charts
        self.controls = controls
        self.status = status
        self.log = log
        self.alert = alert  # an HTML widget: what stopped the run, in words (divergence)
        self.arrange = arrange  # called with the config after a switch of kind
        self.frames = 0  # frames that sent something
        self.publish_s = 0.0  # Python time spent building and sending them
        self.items = queue.SimpleQueue()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by anything but a step: shown without waiting
        self._ps_seen: Counter[int] = Counter()
        self._ps_prev: tuple[float, int, int] | None = None  # (time, torn, lost): the rates
        self._surface_skew: float | None = None
        self._surface_at = 0.0
        self._last_status = 0.0
        self._last_delay: float | None = None
        plane = lab.model.plane
        self._track_chart = [track_chart(lab.spec, name) for name in lab.track]
        self._communication = communication_controls.Feed(charts, lab.replica_slots) \
            if "outer" in charts else None
        self._plane_index = ([lab.spec.index(p) for p in plane]
                             if plane and "plane" in charts else None)
        self._captions(lab.config)
        self.show_replicas()
        if lab.divergence is not None:  # a panel shown after the run diverged says so too
            self.items.put(DivergedItem.of(lab.divergence))
        self._unsubscribe = lab.subscribe(self._put)
        self._thread = threading.Thread(target=self._loop, name="labdist-lab-ui", daemon=True)
        self._thread.start()
        self._timeline_thread = threading.Thread(target=self._timeline_loop, daemon=True,
                                                 name="labdist-lab-timeline")
        if "timeline" in charts:  # on a thread of its own: gathering takes round trips
            self._timeline_thread.start()

    def _put(self, item: RunItem) -> None:
        """Steps wait for the next frame (at most RATE_HZ a second); an event (a click
        applied, a divergence, an error) goes out at once, so a click shows within
        milliseconds of being applied rather than up to a frame later."""
        self.items.put(item)
        if not isinstance(item, StepItem):
            self._wake.set()

    def close(self) -> None:
        self._unsubscribe()
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        if self._timeline_thread.is_alive():
            self._timeline_thread.join(5)

    def _loop(self) -> None:
        period = 1.0 / RATE_HZ
        if self._plane_index is not None:
            self._safe(self._surface, force=True)
        while not self._stop.is_set():
            start = time.monotonic()
            self._wake.clear()  # before draining: an event put from now on wakes the next wait
            items = []
            while True:
                try:
                    items.append(self.items.get_nowait())
                except queue.Empty:
                    break
            if items:
                t0 = time.perf_counter()
                self._safe(self._publish, items)
                self.publish_s += time.perf_counter() - t0
                self.frames += 1
            if start - self._last_status >= 1.0 / STATUS_HZ:
                self._last_status = start
                self._safe(self._show_status)
            self._wake.wait(max(0.0, period - (time.monotonic() - start)))

    def _safe(self, fn, *args, **kwargs) -> None:
        """A drawing problem goes to the log; it must never stop the publisher."""
        try:
            fn(*args, **kwargs)
        except Exception as e:  # reported in the panel, the thread goes on
            self._log(f"panel error: {type(e).__name__}: {e}")

    # -- one frame ------------------------------------------------------------------------------
    def _publish(self, items: list[RunItem]) -> None:
        """Each item drawn on its own: a drawing error (logged) never drops the items after
        it (a divergence's message comes right after its non-finite rows)."""
        rows: list[StepItem] = []
        for item in items:
            if isinstance(item, StepItem):
                rows.append(item)
                continue
            self._safe(self._rows, rows)
            rows = []
            self._safe(self._item, item)
        self._safe(self._rows, rows)

    def _item(self, item: RunItem) -> None:
        match item:
            case EventItem():
                self._event(item)
            case PsStatsItem():
                self._ps_stats(item)
            case ResetItem():
                self._reset()
            case DivergedItem():
                self._diverged(item)
            case ErrorItem():
                self._log(f"step {self.lab.step_count}: run stopped: {item.error}")

    def _rows(self, rows: list[StepItem]) -> None:
        if not rows:
            return
        c = self.charts
        x = [r.step for r in rows]
        n = self.lab.replica_slots  # a replica missing from a row (lost, not yet added): a gap
        c["loss"].append(x, [[_at(r.loss, k) for r in rows] for k in range(n)]
                         + [[r.global_loss for r in rows]])
        c["spread"].append(x, [[r.spread for r in rows]])
        for i, chart in enumerate(self._track_chart):
            c[chart].append(x, [[_at(r.tracked[i], k) for r in rows] for k in range(n)])
        # the metric's partial results (one per replica there was), then the cross-replica
        metric = [r.metric or [float("nan")] for r in rows]
        c["metric"].append(x, [[_at(m[:-1], k) for m in metric] for k in range(n)]
                           + [[m[-1] for m in metric]])
        c["throughput"].append([x[-1]], [[self.lab.steps_per_second()]])
        if self._communication is not None:
            self._communication.append(rows)
        if self._plane_index is not None:  # a diverged path ends at its last finite point
            points = [_rows_of(p, n) for p in (r.plane[:, self._plane_index] for r in rows)
                      if np.isfinite(p).all()]
            c["plane"].append(points)
            self._surface(points=points)

    def _event(self, item: EventItem) -> None:
        label = ", ".join(f"{k} → {_short(v[1], k)}" for k, v in item.changes.items())
        if "replicas" in item.changes:  # quorum mode: who, not a count ("replica 1 lost")
            label = ", ".join([f"replica {r} lost" for r in item.lost]
                              + [f"replica {r} joined" for r in item.joined]) or label
        moved_ps = bool({"kind", "use_locking"} & item.changes.keys())
        for name, chart in self.charts.items():
            if name == "staleness":  # its counts restart when the parameter server changes
                if moved_ps:
                    chart.reset()
                    chart.note = NO_PS_NOTE
                    chart.event(f"since step {item.step}: {label}")
            elif name == "plane":
                chart.event(label)
            elif name == "timeline":  # drawn at the moment it was applied, on its time axis
                chart.mark(f"step {item.step}: {label}", at=item.applied)
            else:
                chart.event(item.step, label)
        if "replicas" in item.changes:  # quorum mode: a replica lost or taken in
            self.show_replicas()
            pause = (item.applied - item.requested) * 1e3
            self._log(f"{item.text}  (training paused {pause:.0f} ms)")
            return
        self._last_delay = item.applied - item.requested
        self._log(f"step {item.step}: {label}  (applied {self._last_delay * 1e3:.0f} ms "
                  "after the request)")
        if moved_ps:
            self._ps_seen.clear()  # the counters now come from another parameter server
            self._ps_prev = None
        self.controls.sync(self.lab.pending_config(), fields=item.changes.keys())
        self._captions(self.lab.config)
        if "kind" in item.changes and self.arrange is not None:
            self.arrange(self.lab.config)
        if "skew" in item.changes and self._plane_index is not None:
            self._surface(force=True)

    def show_replicas(self) -> None:
        """Legends and delay sliders for the replicas there are now (quorum mode: slots for
        replicas not there, lost or not yet added, stay out of sight)."""
        n, slots = self.lab.num_replicas, self.lab.replica_slots
        missing = {f"replica {r}" for r in range(n, slots)}
        for chart in self.charts.values():
            if any(name.startswith("replica ") for name in chart.series):
                chart.hidden = [name for name in chart.series if name in missing]
        self.controls.show_replicas(n)

    def _timeline_loop(self) -> None:
        while not self._stop.wait(TIMELINE_EVERY_S):
            if self.lab.state == "running":
                client = self.lab.strategy.client
                if client is not None:
                    self._safe(self._refresh_timeline, client)

    def _refresh_timeline(self, client: Any) -> None:
        with self.lab.workers_to_poll() as workers:
            self.charts["timeline"].refresh(client, workers=workers)

    def _ps_stats(self, item: PsStatsItem) -> None:
        seen = Counter({int(k): v for k, v in item.staleness.items()})
        delta = {k: v - self._ps_seen.get(k, 0) for k, v in seen.items()
                 if v > self._ps_seen.get(k, 0)}
        self._ps_seen = seen
        self.charts["staleness"].add(delta)
        now, torn, lost = time.monotonic(), item.torn_reads, item.lost_updates
        rates = ""
        if self._ps_prev is not None and now - self._ps_prev[0] > 0.05:
            span = now - self._ps_prev[0]
            rates = (f" ({(torn - self._ps_prev[1]) / span:.0f}/s)",
                     f" ({(lost - self._ps_prev[2]) / span:.0f}/s)")
        self._ps_prev = (now, torn, lost)
        torn_rate, lost_rate = rates or ("", "")
        parts = [f"{item.updates} updates (the bars' total)"]
        if item.kind == "ps_async":
            counts = self.lab.history.updates_per_worker
            speed = self.lab.history.worker_rates()
            parts.append("per worker: " + ", ".join(
                f"w{w} {counts.get(w, 0)} ({speed.get(w, 0.0):.0f}/s)"
                for w in range(self.lab.num_replicas)))
        parts += [f"torn reads: {torn}{torn_rate}", f"lost updates: {lost}{lost_rate}",
                  f"dropped stale: {item.dropped}"]
        self.charts["staleness"].note = " · ".join(parts)

    def _diverged(self, item: DivergedItem) -> None:
        """Say it on the panel: the banner, a mark at the step on every chart, the log."""
        for name, chart in self.charts.items():
            if name == "plane":
                chart.event("diverged")
            elif name != "staleness":
                chart.event(item.step, "diverged")
        self._log(f"step {item.step}: {item.text}")
        if self.alert is not None:
            self.alert.value = (f"<div class='labdist-alert-text'><b>Diverged at step "
                                f"{item.step}</b>: {html.escape(item.where)}. Training "
                                "paused: lower the learning rate and reset.</div>")
            self.alert.layout.display = ""

    def _captions(self, config) -> None:
        """Each chart's line of what to expect, for the mode now in effect."""
        text = captions(config)
        for name, chart in self.charts.items():
            chart.caption = text[name.split(":")[0]]

    def _reset(self) -> None:
        for chart in self.charts.values():
            chart.reset()
        self.charts["staleness"].note = NO_PS_NOTE
        self._ps_seen.clear()
        self._ps_prev = None
        self.log.clear()
        if self.alert is not None:
            self.alert.value = ""
            self.alert.layout.display = "none"
        self._log("reset: back to the initial parameters at step 0")
        if self._plane_index is not None:
            self._surface(force=True)

    # -- the loss surface (two-parameter models) ------------------------------------------
    def _surface(self, points: list[np.ndarray] | None = None, force: bool = False) -> None:
        """Recompute when the skew changed, a path left the box, or the box has become far
        larger than the recent paths need (the axes come back after a blow-up); at most
        twice a second."""
        plane = self.charts["plane"]
        skew = self.lab.pending_config().skew
        box = plane.bounds
        bounds = None
        if not force and box is not None and skew == self._surface_skew:
            if time.monotonic() - self._surface_at < 0.5:
                return
            pts = np.concatenate(points) if points else np.empty((0, 2))
            inside = ((pts[:, 0] >= box[0]) & (pts[:, 0] <= box[1])
                      & (pts[:, 1] >= box[2]) & (pts[:, 1] <= box[3]))
            if inside.all():
                bounds = self._box(skew)
                if not _much_smaller(bounds, box):
                    self._surface_at = time.monotonic()  # checked: the next check in 0.5 s
                    return
        self._surface_at = time.monotonic()
        self._surface_skew = skew
        bounds = bounds or self._box(skew)
        if not np.isfinite(bounds).all() or max(map(abs, bounds)) > 1e100:
            return  # a box around a blown-up path: keep the last surface
        a = np.linspace(bounds[0], bounds[1], GRID)
        b = np.linspace(bounds[2], bounds[3], GRID)
        aa, bb = np.meshgrid(a, b)
        model, (x, y) = self.lab.model, self.lab.data
        base = self.lab.spec.unflatten(self.lab.spec.flatten(model.init_params()))
        n = self.lab.num_replicas
        with np.errstate(all="ignore"):  # a diverged run's box: overflow is drawn, not said
            z = sum(model.loss_grid(aa.ravel(), bb.ravel(), x + r * skew, y, base)
                    for r in range(n)) / n  # every replica's objective, averaged
        if not np.isfinite(z).all():
            return
        plane.set_surface(bounds, z.reshape(GRID, GRID))

    def _box(self, skew: float) -> tuple[float, float, float, float]:
        spec, model = self.lab.spec, self.lab.model
        pts = [spec.flatten(model.init_params())[self._plane_index]]
        x, y = self.lab.data
        for r in range(self.lab.num_replicas):
            optimum = model.solve(x + r * skew, y)
            if optimum is None:  # the model cannot say where its optimum lies
                break
            pts.append(spec.flatten(optimum)[self._plane_index])
        for path in self.charts["plane"].recent(200):
            pts += [np.asarray(q) for q in path]
        pts = np.array(pts)
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        span = np.maximum(hi - lo, 0.5)
        lo, hi = lo - 0.25 * span, hi + 0.25 * span
        return float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])

    # -- text -------------------------------------------------------------------------------------
    def _log(self, line: str) -> None:
        self.log.append(line)

    def _show_status(self) -> None:
        lab = self.lab
        state = (f"<span style='color:#b00'><b>diverged at step {lab.divergence.step}</b>"
                 "</span>" if lab.state == "diverged" and lab.divergence else lab.state)
        parts = [f"<b>step {lab.step_count}</b>", state]
        if lab.state == "running":  # idle, paused or diverged: no rate (it would be stale)
            parts.append(f"{lab.steps_per_second():.0f} steps/s")
        parts.append(lab.config.describe())
        if self._last_delay is not None:
            parts.append(f"last change applied {self._last_delay * 1e3:.0f} ms after request")
        if self.controls.error:
            parts.append(f"<span style='color:#b00'>{self.controls.error}</span>")
        line = " · ".join(parts)
        # one line, whatever its length: a wrapped status would push every chart down as it
        # changes; what does not fit is cut with "…", the whole line on hover
        plain = html.escape(re.sub(r"<[^>]+>", "", line), quote=True)
        text = (f"<div style='white-space:nowrap;overflow:hidden;text-overflow:ellipsis' "
                f"title=\"{plain}\">{line}</div>")
        if self.status.value != text:
            self.status.value = text


def _short(value: Any, name: str = "") -> str:
    described = describe_setting(name, value)
    if described is not None:
        return described
    if value == "ONLY_FIRST_REPLICA":
        return "FIRST"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def track_chart(spec, element: str) -> str:
    """The chart of a tracked element: "track:w" for a parameter's, "state:moving_mean[0]"
    for the model's state (each replica's own; its caption says so)."""
    kind = "state" if element.partition("[")[0] in spec.state_names else "track"
    return f"{kind}:{element}"


def _at(values: list[float], k: int) -> float:
    return values[k] if k < len(values) else float("nan")


def _rows_of(points: np.ndarray, n: int) -> np.ndarray:
    """A (replicas, 2) array with `n` rows: a missing replica's path waits at replica 0's
    point (the plane's paths advance together; in mirrored modes the copies are equal)."""
    return points if len(points) >= n else np.vstack([points, np.repeat(points[:1],
                                                                        n - len(points), 0)])


def _much_smaller(wanted: tuple[float, ...], box: tuple[float, ...]) -> bool:
    """Whether the box the recent paths need is under a third of the shown one on an axis."""
    return any(wanted[i + 1] - wanted[i] < (box[i + 1] - box[i]) / 3 for i in (0, 2))
