"""What runs on workers: the Replica actor, the replica context step functions see, the lane
server, and (ps/) the parameter-server actors. Imports nothing driver-side
(tests/structure/test_layering.py)."""
