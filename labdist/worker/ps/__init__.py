"""The worker side of parameter servers: the `ParameterStore` actor (variables in chunks with
version stamps, SyncReplicas' barrier, the staleness bound, counters) and the
`ParameterServerWorker` actor that runs scheduled functions (pull, compute, push), and how a
caller tells a frozen parameter server from a busy one (`liveness.py`)."""
