"""The `labdist` command line."""

from __future__ import annotations

import argparse
import sys


def _info(args) -> int:
    import dask
    import distributed
    import numpy

    import labdist
    from labdist.backend import gpu_count

    print(f"labdist {labdist.__version__}  python {sys.version.split()[0]}")
    print(f"numpy {numpy.__version__}  dask {dask.__version__}  distributed "
          f"{distributed.__version__}")
    print(f"GPUs visible: {gpu_count()}")
    return 0


def _demo(args) -> int:
    from labdist.demo import run_demo

    run_demo(num_replicas=args.replicas, steps=args.steps)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="labdist", description="tf.distribute's ideas, made real on Dask workers.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a short headless run on an embedded local cluster")
    demo.add_argument("--replicas", type=int, default=2, help="worker processes (default 2)")
    demo.add_argument("--steps", type=int, default=30, help="SGD steps per experiment")
    demo.set_defaults(func=_demo)
    sub.add_parser("info", help="versions and GPUs seen").set_defaults(func=_info)
    args = parser.parse_args(argv)
    if getattr(args, "replicas", 1) < 1 or getattr(args, "steps", 1) < 1:
        parser.error("--replicas and --steps must be positive integers")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
