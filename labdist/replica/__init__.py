"""The replica actor, what runs inside a worker process for a mirrored strategy: the actor
and its step thread (actor.py), the inbox that thread waits on (inbox.py), the step protocol's
messages (step_event.py), the replica context step functions see (replica_context.py), the
fast lane (lane.py: framing and server; lane_end.py: the actor's end), the transports being
chosen (transport_choice.py), the functions it holds (loaded.py), the communication modes it
keeps (communication_state.py), the stand-in for a strategy a step captured
(captured_strategy.py), and how it notices a driver gone (lifetime.py). Imports nothing
driver-side (tests/structure/test_layering.py)."""
