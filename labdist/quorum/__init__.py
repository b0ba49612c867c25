"""Quorum training (`fault_tolerance="quorum"`), both halves: on the driver, `fit` as one
transaction per group over the replicas alive (training.py: the `Quorum` component a strategy
holds, `strategy.quorum`) and membership epochs (membership.py); on each replica, its part in
the transaction (replica_side.py), the undo log (undo.py), the copies handed to a successor
actor (handover.py) and the healing copy a joining replica receives (healing.py)."""
