"""The worker side of peer-to-peer collectives: a Dask WorkerPlugin that registers a comm
handler on every worker (as Dask's P2P shuffle does) and keeps one Mailbox per replica group."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from labdist.collectives.mailbox import Mailbox

PLUGIN_NAME = "labdist-collectives"
HANDLER = "labdist_p2p"


# (worker address, group) -> Mailbox. Module-level, so registering the plugin again (a second
# strategy on the same cluster) never orphans the mailboxes of replicas already running.
_MAILBOXES: dict[tuple[str, str], Mailbox] = {}


class CollectivePlugin(WorkerPlugin):
    """Receives peers' collective messages into mailboxes, keyed by replica group."""

    name = PLUGIN_NAME

    def setup(self, worker) -> None:
        self.worker = worker
        self.received = 0  # messages from peers: collectives never go through the driver
        worker.handlers[HANDLER] = self.receive

    def mailbox(self, group: str) -> Mailbox:
        key = (self.worker.address, group)
        box = _MAILBOXES.get(key)
        if box is None:
            box = _MAILBOXES[key] = Mailbox()
        return box

    def drop(self, group: str) -> None:
        _MAILBOXES.pop((self.worker.address, group), None)

    async def receive(self, group: str, run: int, seq: int, src: int, phase: int = 0,
                      sig: Any = None, payload: Any = None) -> None:
        self.received += 1
        self.mailbox(group).put(run, seq, phase, src, sig, payload)


def get_plugin(worker) -> CollectivePlugin:
    plugin = worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        raise RuntimeError(
            "the labdist collectives plugin is not installed on this worker; "
            "replicas must be placed through labdist.cluster"
        )
    return plugin
