"""Where the time goes, both halves: each process records its phases (phases.py) and formats
them as trace events (trace_events.py); the driver gathers them on one clock (timeline.py),
writes a Perfetto trace (trace.py), and shows replicas' steps in Dask's dashboard
(dashboard.py, fed by each replica's step_report.py). Workers also serve Prometheus metrics
(prometheus.py). The recording half runs in worker processes too, so it imports nothing
driver-side."""
