"""The driver's side of Dask, the only driver-side package that knows it: where the cluster
comes from (local.py), and the replica groups that place actors on its workers and call them
(replica_group.py for the mirrored strategies, ps_group.py for parameter servers), with what
both own and release in actor_group.py. Steps reach the mirrored replicas through a step
channel (step_channel.py): actor calls, or the driver's end of the fast lane (lane.py)."""

from labdist.cluster.local import connect, start_local_cluster

__all__ = ["connect", "start_local_cluster"]
