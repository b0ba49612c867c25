"""Shared memory on one host: areas under /dev/shm that processes map (area.py), a janitor
that removes a process's files the moment it dies (janitor.py), a doorbell that wakes a
process waiting on an area (doorbell.py), and arrays placed once where the replicas read
them (placed.py). The shared-memory transport, the parameter servers' same-host path and
`fit`'s placed input build on these."""
