"""The `labdist` command line: `lab`, `demo`, `run` and `info`.

User mistakes (a bad address, an unknown strategy, a missing optional package) end with one
line on stderr and a non-zero exit, never a traceback; bugs still show theirs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from labdist.cli.mistakes import UserError, quiet_teardown

SCHEDULER_ENV = "LABDIST_SCHEDULER"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (plus where to look), not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not allowed; use a finite number > 0")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; use a TCP port in 1..65535")
    return value


def build_parser() -> argparse.ArgumentParser:
    from labdist.cli.run import STRATEGIES

    parser = _Parser(
        prog="labdist",
        description="tf.distribute's ideas, made real on Dask workers: notebooks, a demo, and "
                    "training runs on a cluster.",
        epilog="Start with `labdist demo`, then `labdist lab`.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)

    lab = sub.add_parser(
        "lab", help="open JupyterLab on the notebooks (the interactive lab first)",
        description="Start JupyterLab on labdist's notebooks, opening notebooks/00_lab.ipynb "
                    "when it is there. Arguments after `--` go to `jupyter lab` as they are.")
    lab.add_argument("directory", nargs="?", default=None,
                     help="folder to serve (default: the notebooks of this checkout)")
    lab.add_argument("--port", type=_port, default=None, help="port (default: 8888 "
                     "or the next free one)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")

    demo = sub.add_parser(
        "demo", help="a short headless run on an embedded cluster, with a PNG and HTML report",
        description="Start a local Dask cluster (no scheduler needed), print the "
                    "synchronization x aggregation table and show the replicas' copies "
                    "staying equal (MEAN) and parting, each on its own path (NONE); write a "
                    "PNG chart of the replicas' values and an HTML report.")
    demo.add_argument("--replicas", type=_positive_int, default=2,
                      help="worker processes, one replica each (default 2)")
    demo.add_argument("--steps", type=_positive_int, default=30,
                      help="SGD steps per experiment (default 30)")
    demo.add_argument("--out", default="labdist-demo", metavar="DIR",
                      help="where to write demo.png and report.html (default ./labdist-demo)")

    run = sub.add_parser(
        "run", help="train on an existing Dask cluster, with progress and a summary",
        description="Train a small classifier on the workers of a running Dask cluster "
                    "(`dask scheduler` + `dask worker`) and print progress and a summary. "
                    "Strategies: " + "; ".join(f"{k}: {v.help}" for k, v in STRATEGIES.items()))
    run.add_argument("--scheduler", default=os.environ.get(SCHEDULER_ENV), metavar="ADDRESS",
                     help=f"scheduler address, e.g. tcp://10.0.0.5:8786 (default: "
                          f"${SCHEDULER_ENV})")
    run.add_argument("--strategy", default="mirrored", choices=list(STRATEGIES),
                     metavar="{" + ",".join(STRATEGIES) + "}",
                     help="how to distribute (default mirrored)")
    run.add_argument("--steps", type=_positive_int, default=200,
                     help="optimizer steps (default 200)")
    run.add_argument("--batch-size", type=_positive_int, default=64,
                     help="global batch size (default 64)")
    run.add_argument("--replicas", type=_positive_int, default=None,
                     help="mirrored: replicas (default: one per worker); parameter-server "
                          "strategies: computing workers (default: all but the PS)")
    run.add_argument("--num-ps", type=_positive_int, default=1,
                     help="parameter-server strategies: parameter servers (default 1)")
    run.add_argument("--learning-rate", type=_positive_float, default=0.05,
                     help="SGD learning rate (default 0.05)")
    run.add_argument("--connect-timeout", type=_positive_float, default=10.0,
                     metavar="SECONDS", help="how long to try to reach the scheduler")

    info = sub.add_parser(
        "info", help="versions, GPUs seen, and the workers of a cluster",
        description="Print the versions labdist runs with and the GPUs this process sees; "
                    "with a scheduler address, also every worker and the GPUs it sees.")
    info.add_argument("--scheduler", default=os.environ.get(SCHEDULER_ENV), metavar="ADDRESS",
                      help=f"also list this cluster's workers (default: ${SCHEDULER_ENV})")
    info.add_argument("--connect-timeout", type=_positive_float, default=10.0,
                      metavar="SECONDS", help="how long to try to reach the scheduler")
    return parser


def _dispatch(args, extra: list[str]) -> int:
    if args.command == "lab":
        from labdist.cli.lab import lab

        return lab(args.directory, args.port, args.no_browser, extra)
    if args.command == "demo":
        from labdist.cli.demo import demo

        return demo(args.replicas, args.steps, args.out)
    if args.command == "run":
        from labdist.cli.run import run

        return run(args)
    from labdist.cli.info import info

    return info(args.scheduler, args.connect_timeout)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after `--` is for the program labdist starts
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if extra and args.command != "lab":
        parser.error(f"arguments after `--` are only for `labdist lab`: {' '.join(extra)}")
    try:
        return _dispatch(args, extra)
    except UserError as error:
        quiet_teardown()
        print(f"labdist {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        quiet_teardown()
        print(f"labdist {args.command}: interrupted", file=sys.stderr)
        return 130
