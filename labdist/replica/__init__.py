"""The replica actor, what runs inside a worker process for a mirrored strategy: the actor
and its step thread (actor.py), the inbox that thread waits on (inbox.py), the events it
reports (step_event.py), the replica context step functions see (replica_context.py), the
fast lane's replica end (lane.py), the functions it holds (loaded.py) and how it notices a
driver gone (lifetime.py). Imports nothing driver-side (tests/structure/test_layering.py)."""
