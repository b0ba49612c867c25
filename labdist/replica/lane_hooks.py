"""The replica actor's end of the driver's fast lane (replica/lane.py), mixed into `Replica`:
open and close it, hand the driver's authenticated connection to the step thread
(replica/inbox.py), and answer a request there, running its step on the spot."""

from __future__ import annotations

import pickle
import traceback

from labdist.replica.lane import LaneServer
from labdist.replica.step_event import StepEvent, encode
from labdist.shipping import picklable_error


class LaneHooks:
    """Mixed into `Replica`, whose `core`, `where`, `_lane`, `_watch` and `_load` it uses;
    the driver calls `lane_open` / `lane_close` as actor methods."""

    async def lane_open(self) -> tuple[tuple[str, int], str, str | None] | None:
        """Open the driver's fast lane (replica/lane.py); None where Dask's comms use TLS."""
        from distributed import get_worker
        from distributed.comm import get_address_host, parse_address

        worker = get_worker()
        if parse_address(worker.address)[0] != "tcp":
            return None
        self.lane_close()  # one lane at a time
        try:
            self._lane = LaneServer(get_address_host(worker.address), self._lane_request,
                                    on_drop=self._watch.lane_dropped,
                                    hand_off=self._hand_lane)
        except OSError:  # cannot listen here: the driver uses actor calls
            return None
        return self._lane.address, self._lane.token, self._lane.local_name

    def _hand_lane(self, conn) -> None:
        """The driver's authenticated connection: the step thread reads it from now on."""
        self.core.attach_lane(conn, self._lane_request, lambda e: encode(e, self.where),
                              self._watch.lane_dropped)

    def lane_close(self) -> None:
        if self._lane is not None:
            self._lane.close()
            self._lane = None
            self.core.inbox.detach()

    def _lane_request(self, raw: bytes) -> bytes:
        """The same for a request that came by the lane, on the step thread, which runs the
        step right here (replica/inbox.py); never raises, so the lane always answers and
        stays in step with the driver."""
        try:
            request = pickle.loads(raw)
            if request[0] != "run":  # a resume the step would have taken in merge_call
                raise RuntimeError(f"replica {self.core.rank} is not waiting in merge_call")
            _, run_id, fn_ref, args, kwargs, steps = request
            fn = self._load(run_id, fn_ref)
        except Exception as e:
            return encode(StepEvent("error", 0, error=picklable_error(e),
                                    remote_traceback=traceback.format_exc()), self.where)
        try:
            return encode(self.core.run_now(run_id, fn, args, kwargs, steps), self.where)
        except Exception as e:
            return encode(StepEvent("error", 0, error=RuntimeError(
                f"{self.where} could not answer a step request: {type(e).__name__}: {e}"),
                remote_traceback=traceback.format_exc()), self.where)
