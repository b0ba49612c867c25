"""A replica's end of the driver's fast lane (replica/lane.py): open and close it, hand the
driver's authenticated connection to the step thread (replica/inbox.py), and answer a request
there, running its step on the spot. The `Replica` actor holds one."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable
from typing import Any

from labdist.replica.lane import LaneServer
from labdist.replica.step_event import RunStep, StepEvent, encode
from labdist.shipping import picklable_error


class LaneEnd:
    """The lane of one replica: its `ReplicaCore`, its name in errors, the driver watch that
    hears a dropped lane, and how the actor loads a run's step function."""

    def __init__(self, core: Any, where: str, lane_dropped: Callable[[], None],
                 load: Callable[[int, tuple], Any]):
        self.core, self.where = core, where
        self._dropped, self._load = lane_dropped, load
        self._server: LaneServer | None = None

    def open(self) -> tuple[tuple[str, int], str, str | None] | None:
        """Open the driver's fast lane (replica/lane.py); None where Dask's comms use TLS."""
        from distributed import get_worker
        from distributed.comm import get_address_host, parse_address

        worker = get_worker()
        if parse_address(worker.address)[0] != "tcp":
            return None
        self.close()  # one lane at a time
        try:
            self._server = LaneServer(get_address_host(worker.address), self._request,
                                      on_drop=self._dropped, hand_off=self._hand)
        except OSError:  # cannot listen here: the driver uses actor calls
            return None
        return self._server.address, self._server.token, self._server.local_name

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            self.core.inbox.detach()

    def _hand(self, conn) -> None:
        """The driver's authenticated connection: the step thread reads it from now on."""
        self.core.attach_lane(conn, self._request, lambda e: encode(e, self.where),
                              self._dropped)

    def _request(self, raw: bytes) -> bytes:
        """A request that came by the lane, on the step thread, which runs the step right here
        (replica/inbox.py); never raises, so the lane always answers and stays in step with
        the driver."""
        try:
            request = pickle.loads(raw)
            if not isinstance(request, RunStep):  # a resume: merge_call would have taken it
                raise RuntimeError(f"replica {self.core.rank} is not waiting in merge_call")
            run_id, args, kwargs, steps = (request.run_id, request.args, request.kwargs,
                                           request.steps)
            fn = self._load(run_id, request.fn_ref)
        except Exception as e:
            return encode(StepEvent("error", 0, error=picklable_error(e),
                                    remote_traceback=traceback.format_exc()), self.where)
        try:
            return encode(self.core.run_now(run_id, fn, args, kwargs, steps), self.where)
        except Exception as e:
            return encode(StepEvent("error", 0, error=RuntimeError(
                f"{self.where} could not answer a step request: {type(e).__name__}: {e}"),
                remote_traceback=traceback.format_exc()), self.where)
