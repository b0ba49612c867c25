"""Collectives among replicas: algorithms (all-reduce, all-gather) over a transport."""

from labdist.collectives.algorithms import all_gather, all_reduce, check_signatures
from labdist.collectives.communicator import Communicator, LocalCommunicator

__all__ = ["Communicator", "LocalCommunicator", "all_gather", "all_reduce", "check_signatures"]
