"""Parameter servers, both halves. On the driver: `ParameterServerStrategy` (strategy.py),
the `ClusterCoordinator` that schedules functions onto its workers (coordinator.py) and the
`RemoteValue`s it hands out (remote_values.py), the merged `ParameterServerStats`
(stats.py), `model.fit` on parameter servers (fit.py), the actors' placement and calls
(actors.py). What both sides share: the actors' settings (settings.py) and a push
(push.py). In the worker processes: the `ParameterStore` actor of each parameter server
(store.py, its variables in chunks: chunked.py; counters.py; synchronous rounds: sync.py;
stale synchronous parallel: ssp.py),
the `ParameterServerWorker` actor (worker.py) and what a scheduled function sees there
(worker_context.py), how a call's end is reported (outcome.py) and a frozen server told from
a busy one (liveness.py), compressed pushes (compressed_push.py), and the same-host path over
/dev/shm (shm_wire.py, shm_client.py, shm_server.py). The worker-side modules import nothing
driver-side (tests/structure/test_layering.py)."""

from labdist.parameter_server.coordinator import ClusterCoordinator
from labdist.parameter_server.remote_values import PerWorkerDataset, RemoteValue
from labdist.parameter_server.stats import ParameterServerStats
from labdist.parameter_server.strategy import ParameterServerStrategy

__all__ = [
    "ClusterCoordinator",
    "ParameterServerStats",
    "ParameterServerStrategy",
    "PerWorkerDataset",
    "RemoteValue",
]
