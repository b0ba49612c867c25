"""Taking turns when the suite runs in several processes (`pytest -n N`, pytest-xdist).

Most tests only need their own clusters and kernels and run side by side. A few need the
machine to themselves: they time what a user sees (a chart drawn, ■ answered), or they count
what the whole machine holds (files in /dev/shm, semaphores, processes). Those run *alone*:
while one runs, no other test of the session does, and a module of them keeps its turn from
its first test to its last (its JupyterLab or cluster fixtures are not left to idle while
others run).

The turns are `flock` locks in a folder the session's processes share: every other test
holds the *room* lock shared, an alone one holds it exclusively; the *door* lock, held by an
alone test while it waits, keeps new tests from slipping in before it (else the other
processes' tests, one after another, could keep it waiting for good). A process about to wait
for an alone test (its *notice* lock is taken) first lets its idle clusters go
(`before_waiting`), so the one running alone has the machine a user would have. Without xdist
nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

ALONE_FIXTURES = {"quiet_machine"}  # what a module asks for when it times what a user sees


def runs_alone(item: pytest.Item) -> bool:
    """Marked `alone` or `browser`, or asking for a quiet machine."""
    if item.get_closest_marker("alone") or item.get_closest_marker("browser"):
        return True
    return isinstance(item, pytest.Function) and bool(ALONE_FIXTURES & set(item.fixturenames))


class Turns:
    """One xdist worker's side of the turns (`folder`: shared by the run's workers)."""

    def __init__(self, folder: Path, before_waiting: Callable[[], None]):
        # notice: held by an alone test from before it waits until it ends (the others'
        # sign to let their idle clusters go); door and room as the module says
        self._notice, self._door, self._room = (
            os.open(folder / name, os.O_CREAT | os.O_RDWR) for name in ("notice", "door", "room"))
        self._before_waiting = before_waiting
        self._alone = False  # holding an alone turn (kept across a module's alone tests)

    def take(self, alone: bool) -> None:
        """Wait for this test's turn."""
        if alone:
            if self._alone:
                return
            fcntl.flock(self._notice, fcntl.LOCK_EX)
            fcntl.flock(self._door, fcntl.LOCK_EX)  # shut while the room empties and it runs
            fcntl.flock(self._room, fcntl.LOCK_EX)
            self._alone = True
            return
        self.give_back()
        if _try(self._notice, fcntl.LOCK_SH):
            fcntl.flock(self._notice, fcntl.LOCK_UN)
        else:
            self._before_waiting()  # an alone test waits or runs
        fcntl.flock(self._door, fcntl.LOCK_EX)
        fcntl.flock(self._room, fcntl.LOCK_SH)
        fcntl.flock(self._door, fcntl.LOCK_UN)

    def give_back(self) -> None:
        """After a test: let others in (an alone turn kept for the module's next test is not
        given back)."""
        fcntl.flock(self._room, fcntl.LOCK_UN)
        if self._alone:
            fcntl.flock(self._door, fcntl.LOCK_UN)
            fcntl.flock(self._notice, fcntl.LOCK_UN)
            self._alone = False


def _try(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


BEFORE_WAITING: list[Callable[[], None]] = []  # conftest adds what lets idle clusters go
_TURNS = pytest.StashKey["Turns | None"]()


def pytest_configure(config: pytest.Config) -> None:
    """This worker's turns under xdist (`config.workerinput` is xdist's); none without it."""
    workerinput = getattr(config, "workerinput", None)
    turns = None
    if workerinput is not None:
        folder = Path(tempfile.gettempdir()) / f"labdist-turns-{workerinput['testrunuid']}"
        folder.mkdir(exist_ok=True)
        turns = Turns(folder, lambda: [fn() for fn in BEFORE_WAITING])
    config.stash[_TURNS] = turns


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test's setup, call and teardown in its turn. First of the wrappers, so the wait
    for a turn is outside pytest-timeout's timer (which starts in its own wrapper)."""
    turns = item.config.stash[_TURNS]
    if turns is None:
        return (yield)
    turns.take(runs_alone(item))
    try:
        return (yield)
    finally:
        if not keeps_turn(item, nextitem):
            turns.give_back()


def keeps_turn(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Whether `item`'s turn carries on to `nextitem`: both alone, in one module."""
    return (nextitem is not None and runs_alone(item) and runs_alone(nextitem)
            and nextitem.module is item.module)
