"""Every ```python block of README.md runs, each on its own, in one fresh process.

The README is the first code a user reads, so it is tested as written, and every block is
self-contained: a user can paste any one of them alone. Each block runs in a namespace of its
own (a name an earlier block defined is not there), as the main module, so that
`if __name__ == "__main__":` holds as in a script (Dask spawns worker processes, which import
the main module again). After each block the harness closes the labs, strategies and Dask
clusters the block left open, so the blocks do not pile up worker processes on a small
machine; what a block closes itself is closed once. Tracebacks name README.md and its line
numbers. A README's `bash` blocks are the set-up commands, checked against `.ci/run`.

Conventions, in README.md itself:

- **Shown output.** A comment `# prints: TEXT` says the block prints the line TEXT. A block
  with such comments must print exactly those lines, in order (nothing else); `...` in TEXT
  stands for any characters. A block without them may print anything.
- **Skipped blocks.** `<!-- no-test: REASON -->` on the line before the opening fence skips
  that block, for the one case where running it is truly impossible here (a real machine's
  address that no embedded cluster can stand in for). Prefer an embedded stand-in (the
  README's "Run on a cluster" block uses a `LocalCluster`); every skip is listed by
  `test_skipped_blocks_say_why`, and today there are none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
RUN_TIMEOUT_S = 300  # the whole README; it takes ~40 s on 2 cores
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_SKIP = re.compile(r"<!--\s*no-test:\s*(.*?)\s*-->\s*$")
_PRINTS = re.compile(r"#\s*prints:\s?(.*?)\s*$")

# Runs each block in the script's own globals (as a script's code would run), its stdout
# captured, then writes what each block printed to a JSON file. The harness keeps its names in
# a function, so the README's `out` or `code` never collide with them.
_HARNESS = '''\
import contextlib as _contextlib
import io as _io
import json as _json
import sys as _sys


def _close_left_open(namespace):
    """Close what a block left running: labs first (they may hold a strategy), then
    strategies, then clusters."""
    import distributed
    import labdist

    kinds = (labdist.Lab, labdist.Strategy, distributed.deploy.Cluster)
    for kind in kinds:
        for value in list(namespace.values()):
            if isinstance(value, kind) and not getattr(value, "closed", False):
                with _contextlib.suppress(Exception):
                    value.close()


def _run_readme(blocks_file, printed_file):
    printed = []
    for block in _json.loads(open(blocks_file).read()):
        # pad with newlines so that tracebacks show README.md's own line numbers
        code = compile("\\n" * (block["line"] - 1) + block["source"], block["file"], "exec")
        out = _io.StringIO()
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        try:
            with _contextlib.redirect_stdout(out):
                exec(code, namespace)
        finally:
            _close_left_open(namespace)
        printed.append(out.getvalue())
        _sys.stdout.write(out.getvalue())
        _sys.stdout.flush()
    with open(printed_file, "w") as f:
        _json.dump(printed, f)


if __name__ == "__main__":
    _run_readme(_sys.argv[1], _sys.argv[2])
'''


@dataclass(frozen=True)
class Block:
    line: int  # README line of the block's first line of code
    source: str
    skip: str | None  # why it is not run, or None

    def expected(self) -> list[str]:
        return [m[1] for line in self.source.splitlines() if (m := _PRINTS.search(line))]


def readme_blocks(text: str) -> list[Block]:
    """The ```python blocks of a markdown text, in order."""
    blocks = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start(1)) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        blocks.append(Block(line, m[1], skip[1] if skip else None))
    return blocks


def matches(expected: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


BLOCKS = readme_blocks(README.read_text())


def test_the_blocks_are_found():
    """The parser sees the README's examples (a changed fence would silently test nothing)."""
    assert len(BLOCKS) >= 5
    assert any("MirroredStrategy" in b.source for b in BLOCKS)
    assert any("ParameterServerStrategy" in b.source for b in BLOCKS)


def test_the_conventions_parse():
    text = ("x\n```python\nprint(1)  # prints: 1\n```\n<!-- no-test: needs a browser -->\n"
            "```python\nlab.show()\n```\n")
    a, b = readme_blocks(text)
    assert (a.line, a.skip, a.expected()) == (3, None, ["1"])
    assert (b.line, b.skip) == (7, "needs a browser")
    assert matches("PerReplica:...", "PerReplica:{0: 1}")
    assert not matches("(13.0, 13.0)", "(array(13.), array(13.))")


def test_skipped_blocks_say_why():
    skipped = [b for b in BLOCKS if b.skip is not None]
    assert len(skipped) <= 1, f"keep skips few: {[(b.line, b.skip) for b in skipped]}"
    assert all(b.skip for b in skipped), "a no-test comment must give its reason"


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_every_python_block_runs_alone_and_prints_what_it_shows(tmp_path: Path):
    run = [b for b in BLOCKS if b.skip is None]
    (tmp_path / "blocks.json").write_text(json.dumps(
        [{"line": b.line, "source": b.source, "file": str(README)} for b in run]))
    (tmp_path / "readme_script.py").write_text(_HARNESS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(README.parent), os.environ.get("PYTHONPATH")) if p)}
    result = subprocess.run(
        [sys.executable, "readme_script.py", "blocks.json", "printed.json"], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (f"a README block failed:\n{result.stdout[-3000:]}\n"
                                    f"{result.stderr[-5000:]}")
    printed = json.loads((tmp_path / "printed.json").read_text())
    for block, out in zip(run, printed, strict=True):
        expected = block.expected()
        if not expected:
            continue
        lines = out.splitlines()
        assert len(lines) == len(expected) and all(map(matches, expected, lines)), (
            f"README.md block at line {block.line} shows {expected}, but printed {lines}")


ROOT = README.parent
_CITED = re.compile(r"([\w./-]+\.md)\b(?: §(\d+))?")
_LINKED = re.compile(r"\]\((?!https?://|#)([^)#\s]+)")


def _sources() -> list[Path]:
    """Every file a reader or a test author reads: README, docs, tests, package, notebooks."""
    files = [README, *ROOT.glob("docs/*.md"), *ROOT.glob("tests/**/*.py"),
             *ROOT.glob("labdist/**/*.py"), *ROOT.glob("notebooks/*.ipynb"),
             *ROOT.glob("bench/*.py")]
    return [f for f in files if f.is_file()]


def test_every_cited_document_is_shipped():
    """A citation like "docs/semantics.md §2" leads to a file in the repository, and its
    section exists; a link in docs/ leads to a file (the product stands alone)."""
    missing = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for name, section in _CITED.findall(text):
            target = next((t for t in (ROOT / name, path.parent / name) if t.is_file()), None)
            if target is None:
                missing.append(f"{path.relative_to(ROOT)} cites {name}")
            elif section and not re.search(rf"^## {section}\. ", target.read_text(), re.M):
                missing.append(f"{path.relative_to(ROOT)} cites {name} §{section}")
        if path.parent.name == "docs":
            missing += [f"{path.relative_to(ROOT)} links to {t}" for t in _LINKED.findall(text)
                        if not (path.parent / t).exists()]
    assert not missing, missing


def test_ci_runs_the_readme_set_up_commands():
    """The two set-up commands of the README (install + the demo; the test command) are what
    CI runs, line for line: what a user copies is what CI checks."""
    text = README.read_text()
    setup = text[text.index("## Set up"):]
    block = re.search(r"^```bash\n(.*?)^```", setup, re.M | re.S)[1]
    install, tests = block.strip().splitlines()
    assert "pip install" in install and "labdist demo" in install
    assert "pytest" in tests
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install in ci and tests in ci, (install, tests)
    assert ci.index(install) < ci.index(tests)
