"""Transports: one module per way of moving collectives' data between replicas (Dask comms,
shared memory, NCCL, and an in-process test double). base.py says what each implements;
collectives/registry.py lists those a replica group can choose from."""
