"""The driver's side of Dask: where the cluster comes from (local.py, probe.py, capacity.py,
threads.py), who lets it go (reaper.py), and the mirrored replica group that places Replica
actors on its workers (dask_group.py, on actor_group.py, which the parameter servers'
group shares) and reaches them through a step channel (step_channel.py): actor calls, or the
fast lane (lane_channel.py)."""

from labdist.cluster.local import connect, start_local_cluster

__all__ = ["connect", "start_local_cluster"]
