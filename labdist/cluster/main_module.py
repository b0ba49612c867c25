"""Whether the embedded cluster's worker processes can start from this program.

Dask starts worker processes with multiprocessing's "spawn": each new process imports the
program's main module again (as `__mp_main__`), running its top level. A script that makes a
strategy at its top level, outside `if __name__ == "__main__":`, would then make one in
every worker, and each of those would start workers of its own: Dask prints a traceback per
worker and "Nanny failed to start". A script read from stdin cannot be imported at all. Both
are found here before any worker starts, and said in one line with the fix.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from types import FrameType

GUARD = 'if __name__ == "__main__":'


def check() -> None:
    """Raise `RuntimeError` (one line, with the fix) where spawned workers could not start."""
    main = sys.modules.get("__main__")
    file = None if main is None else main.__dict__.get("__file__")
    if file is None:  # Jupyter, IPython, `python -c`: spawn does not import a main module
        return
    if file == "<stdin>" or not Path(file).is_file():
        raise RuntimeError(
            f"labdist starts worker processes that import your program again, and {file!r} "
            "cannot be imported: save the script to a file and run that (or use Jupyter)")
    line = _top_level_line(inspect.currentframe(), main.__dict__)
    if line is not None and not _guarded(Path(file), line):
        raise RuntimeError(
            f"labdist starts worker processes that import {Path(file).name} again, which "
            f"would run its line {line} again in each: put the script's top-level code under "
            f"`{GUARD}` (see the README's examples)")


def _top_level_line(frame: FrameType | None, main_globals: dict) -> int | None:
    """The line of the main module's top level that this call comes from (None: it comes
    from elsewhere, such as a kernel or a test runner's own guarded call)."""
    line = None
    while frame is not None:
        if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    return line


def _guarded(path: Path, line: int) -> bool:
    """Whether `line` of the script lies inside an `if __name__ == "__main__":` block (a
    script that cannot be parsed is given the benefit of the doubt)."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and _is_main_test(node.test)
                and node.body[0].lineno <= line <= (node.body[-1].end_lineno or line)):
            return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
