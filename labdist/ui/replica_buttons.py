"""The panel's "kill replica" / "add replica" buttons (quorum mode only): each calls the plain
`lab.kill_replica(rank)` / `lab.add_replica()`, and a refusal goes to the panel's log."""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as w


class ReplicaButtons:
    def __init__(self, lab, on_error: Callable[[str], None]):
        self.lab = lab
        self.on_error = on_error
        self.kill = w.Button(description="kill replica", button_style="danger",
                             tooltip="SIGKILL this replica's worker process; the others go on",
                             layout=w.Layout(width="100px"))
        self.rank = w.BoundedIntText(value=lab.num_replicas - 1, min=0,
                                     max=lab.replica_slots - 1, layout=w.Layout(width="52px"),
                                     tooltip="the replica to kill")
        self.add = w.Button(description="add replica", tooltip="start one more worker: it "
                            "becomes a replica at the next step boundary",
                            layout=w.Layout(width="100px"))
        for name in ("kill", "rank", "add"):
            getattr(self, name).add_class(f"labdist-replica-{name}")
        self.kill.on_click(lambda _b: self._safely(lambda: lab.kill_replica(self.rank.value)))
        self.add.on_click(lambda _b: self._safely(lab.add_replica))
        self.widget = w.HBox([self.kill, self.rank, self.add])

    def _safely(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as e:  # shown in the log, never raised into the kernel
            self.on_error(f"refused: {type(e).__name__}: {e}")
