"""The Dask dashboard, made to show labdist: replicas' steps in its task stream, and a link
that opens where the browser can reach it (through jupyter-server-proxy on Binder/JupyterHub).

Replicas log their steps as events (`timing/step_report.py`); `ReplicaStepStream`, a scheduler
plugin, adds each busy span to the task stream the dashboard draws (one row per replica
thread, named `labdist-replica-step`) and, on a second row per replica, the span's phases as
bars named `labdist-compute`, `labdist-wait`, `labdist-comm`, ...; `client.get_events(TOPIC)`
returns them as logged. The task stream is what the dashboard's Task Stream plots and what
`distributed.performance_report` draws and sums, so both show labdist's phases.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from distributed.diagnostics.plugin import SchedulerPlugin

from labdist.timing.step_report import TOPIC

logger = logging.getLogger(__name__)
TASK_PREFIX = "labdist-replica-step"
PHASE_PREFIX = "labdist-"  # + the phase: a task-stream name per phase (labdist-wait, ...)
PROXY_PREFIX_ENV = "JUPYTERHUB_SERVICE_PREFIX"  # set by JupyterHub, and so on Binder
LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]"}


class ReplicaStepStream(SchedulerPlugin):
    """On the scheduler: each span of replica steps becomes a task-stream record, so the
    dashboard's Task Stream shows every replica working, as it shows tasks."""

    name = "labdist-replica-steps"
    idempotent = True  # every strategy on a cluster registers it; the first one stays

    def __init__(self) -> None:
        self.scheduler: Any = None
        self._bars = 0  # reports turned into phase bars: keeps their keys unique

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or self.scheduler is None:
            return
        from distributed.diagnostics.task_stream import TaskStreamPlugin

        plugins = self.scheduler.plugins
        if TaskStreamPlugin.name not in plugins:  # as the dashboard itself does
            self.scheduler.add_plugin(TaskStreamPlugin(self.scheduler))
        stream = plugins[TaskStreamPlugin.name]
        for start, stop, first, steps, collectives in msg["spans"]:
            stream.buffer.append({
                "key": f"{TASK_PREFIX}-{msg['replica']}-{first}-{first + steps - 1}",
                "worker": msg["worker"], "thread": msg["thread"], "status": "OK",
                "startstops": [{"action": "compute", "start": start, "stop": stop}],
                "nbytes": 0, "type": "labdist step", "replica": msg["replica"],
                "group": msg["group"], "steps": steps, "collectives": collectives})
            stream.index += 1
        for n, (phase, start, stop) in enumerate(msg.get("phases", ())):
            # a row of its own under the replica's steps, a bar per phase: labdist-wait, ...
            stream.buffer.append({
                "key": f"{PHASE_PREFIX}{phase}-{msg['replica']}-{self._bars}-{n}",
                "worker": msg["worker"], "thread": f"{msg['thread']}-phases", "status": "OK",
                "startstops": [{"action": "compute", "start": start, "stop": stop}],
                "nbytes": 0, "type": "labdist phase", "replica": msg["replica"],
                "group": msg["group"], "phase": phase})
            stream.index += 1
        self._bars += 1


def show_replica_steps(client: Any) -> bool:
    """Install `ReplicaStepStream` on the client's scheduler (once). False where the scheduler
    cannot load it (labdist not installed there): training runs the same, the events are still
    in `client.get_events(TOPIC)`, only the task stream stays empty."""
    try:
        client.register_plugin(ReplicaStepStream())
    except Exception as e:  # an external scheduler without labdist: say so in the log only
        logger.info("the Dask dashboard will not show replica steps: %s", e)
        return False
    return True


def proxied_link(link: str | None, environ: Mapping[str, str] | None = None,
                 proxy_installed: bool | None = None) -> str | None:
    """Dask's dashboard `link`, as the browser can open it: under JupyterHub/Binder the
    dashboard listens on the server's host, which the browser cannot reach, so the link goes
    through jupyter-server-proxy, `{prefix}proxy/{port}/status`. Unchanged elsewhere, for a
    dashboard on another host, or without jupyter-server-proxy."""
    environ = os.environ if environ is None else environ
    prefix = environ.get(PROXY_PREFIX_ENV)
    if not link or not prefix:
        return link
    if proxy_installed is None:
        proxy_installed = importlib.util.find_spec("jupyter_server_proxy") is not None
    parts = urlsplit(link)
    if not proxy_installed or parts.port is None or parts.hostname not in LOCAL_HOSTS | {
            environ.get("HOSTNAME", "")}:
        return link
    path = parts.path or "/status"
    return f"{prefix.rstrip('/')}/proxy/{parts.port}{path}"
