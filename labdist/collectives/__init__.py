"""Collectives among replicas: algorithms (all-reduce, all-gather) over a Communicator, whose
transports (transports/, chosen from registry.py) move the data."""

from labdist.collectives.algorithms import all_gather, all_reduce, check_signatures
from labdist.collectives.communicator import Communicator

__all__ = ["Communicator", "all_gather", "all_reduce", "check_signatures"]
