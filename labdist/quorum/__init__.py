"""Quorum training (`fault_tolerance="quorum"`), both halves: on the driver, `fit` as one
transaction per group over the replicas alive (fit.py), the strategy's quorum methods
(methods.py) and membership epochs (membership.py); on each replica, its part in the
transaction (replica_side.py), the undo log (undo.py), the copies handed to a successor
actor (handover.py) and the healing copy a joining replica receives (healing.py)."""
