"""The two tools behind "■ stops the call, never the cluster" (labdist/interrupts.py), on
real signals: a SIGINT sent to this very process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from labdist import interrupts

SIGINT_BIT = 1 << (signal.SIGINT - 1)


def _blocked(tid: int | None = None) -> int:
    """The SigBlk mask of thread `tid` (default: the calling thread), read from /proc."""
    tid = threading.get_native_id() if tid is None else tid
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


def test_deferred_holds_the_interrupt_until_the_block_ends():
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the signal's Python handler has had its chances
            done.append(1)
        done.append("whole")
    assert done[-1] == "whole"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_blocks_raise_once_at_the_outer_end():
    steps = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(10000))
        steps.append("inner ended quietly")
    assert steps == ["inner ended quietly"]


def test_a_quiet_block_raises_nothing_and_restores_the_handler():
    with interrupts.deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):  # and an interrupt after it is an interrupt again
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(10000))


def test_deaf_children_blocks_sigint_for_threads_and_processes_started_inside():
    seen: dict[str, int] = {}

    def child_thread():
        seen["thread"] = _blocked()
        out = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                             capture_output=True, text=True, check=True).stdout
        seen["process"] = int(next(line for line in out.splitlines()
                                   if line.startswith("SigBlk:")).split()[1], 16)

    before = _blocked()
    with interrupts.deaf_children():
        t = threading.Thread(target=child_thread)
        t.start()
    t.join()
    assert seen["thread"] & SIGINT_BIT and seen["process"] & SIGINT_BIT, seen
    assert _blocked() == before  # the caller hears interrupts again
