"""The strict double: a CPU stand-in for a GPU replica, so code written for cupy is checked on
machines without one. `array.py` is the `xp` (numpy underneath; device arrays refuse implicit
host conversion as cupy's do), `cuda.py` its `xp.cuda` (devices, streams, events, device
pointers), `nccl.py` its `cupy.cuda.nccl` (collectives between processes over Unix sockets),
`backend.py` the `Backend` that hands them out."""
