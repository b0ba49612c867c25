"""The distributed trainer behind `fit`: the training step as the replicas run it (steps.py),
the epoch loop on the driver (fit_loop.py) and the span the replicas run on their own
(epoch_plan.py, loop_board.py), DDP's overlap (overlap.py), local SGD / DiLoCo
(diloco.py) and their per-replica checkpoints (replica_slots.py)."""
