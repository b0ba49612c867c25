"""The package's layering, read from its own imports (docs/architecture.md draws it).

Every import in labdist (module level or inside a function; not under TYPE_CHECKING) must go
down the layers or stay in its layer, no module may import a private name from another
package, worker-side code must import nothing driver-side, and no import circle may form.
No module may touch another package's private attributes either (`obj._name`; see
`private_attributes`), and no module outside `labdist/devices/` asks which array backend it
has: that is a question for the `Backend`. A failure names the offending import, access or
comparison, file and line.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "labdist"

# Top to bottom; a module may import its own layer or any layer below it. A layer names
# packages and modules: a feature package keeps its driver and worker halves together (as
# dask's shuffle/), so its modules may sit in different layers. The longest name that
# matches a module decides its layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("app", ("labdist.cli", "labdist.__main__", "labdist.demo")),
    ("ui", ("labdist.ui",)),
    ("lab", ("labdist.lab",)),
    ("training", ("labdist.training", "labdist.data.placed_input")),
    ("parameter_server", ("labdist.parameter_server",)),
    ("strategies", ("labdist.strategies", "labdist.variables", "labdist.context",
                    "labdist.tf_compat",
                    "labdist.quorum", "labdist.data.feeds", "labdist.data.dataset_placement")),
    ("cluster", ("labdist.cluster", "labdist.quorum.membership", "labdist.timing.timeline",
                 "labdist.timing.trace", "labdist.timing.dashboard")),
    # what runs inside worker processes: the actors and their parts
    ("worker", ("labdist.replica", "labdist.data.pipeline_feed",
                "labdist.timing.step_report", "labdist.timing.prometheus",
                *(f"labdist.quorum.{m}" for m in ("replica_side", "undo", "handover",
                                                  "healing")),
                *(f"labdist.parameter_server.{m}" for m in (
                    "store", "chunked", "counters", "sync", "ssp", "worker", "worker_context",
                    "outcome", "liveness", "compressed_push", "shm_wire", "shm_client",
                    "shm_server", "settings", "push")))),
    ("collectives", ("labdist.collectives",)),
    ("base", ("labdist.aggregation", "labdist.autodiff", "labdist.checks", "labdist.devices",
              "labdist.enums", "labdist.errors", "labdist.interrupts", "labdist.nest",
              "labdist.network", "labdist.shipping", "labdist.values", "labdist.actor_call",
              "labdist.shm", "labdist.data", "labdist.timing")),
]
# What runs inside worker processes (actors, collectives): never the driver's code.
WORKER_SIDE = ("worker", "collectives", "base")
# The one sanctioned upward import: `Lab.show()` opens the UI lazily, so a headless lab
# (CI, scripts) never needs ipywidgets.
ALLOWED_UPWARD = {("labdist.lab.lab", "labdist.ui.panel")}
# Underscored names another library documents as its public API: namedtuple's.
DOCUMENTED_PRIVATE = {"_asdict", "_fields", "_make", "_replace"}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module
    names: tuple[str, ...]  # names taken from it (from-imports)
    where: str  # file:line


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def parsed(root: Path) -> tuple[tuple[Path, ast.Module], ...]:
    """Every module under `root`, parsed once per session: the rules only read the trees
    (the real tree takes seconds to parse; each fake package in tmp_path has a root of its
    own, so it is parsed after it was written)."""
    return tuple((path, ast.parse(path.read_text(), filename=str(path)))
                 for path in sorted(root.rglob("*.py")))


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(root: Path) -> list[Import]:
    """Every labdist-internal import under `root` (a package directory named labdist)."""
    found = []
    for path, tree in parsed(root):
        source = module_name(path, root)
        skip = _type_checking_lines(tree)
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        relative = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skip:
                continue
            where = f"{relative}:{node.lineno}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == root.name:
                        found.append(Import(source, alias.name, (), where))
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against the importing package
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if target.split(".")[0] != root.name:
                    continue
                names = tuple(a.name for a in node.names)
                modules = [f"{target}.{n}" for n in names
                           if (root.parent / Path(*f"{target}.{n}".split("."))).exists()
                           or (root.parent / Path(*f"{target}.{n}".split("."))).with_suffix(
                               ".py").exists()]
                if len(modules) < len(names):  # names defined by the package itself
                    found.append(Import(source, target, names, where))
                found += [Import(source, m, (), where) for m in modules]
    return found


def layer_of(module: str) -> int | None:
    """The layer of the longest name in LAYERS that is `module` or a package above it."""
    best, length = None, -1
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > length:
                best, length = i, len(name)
    return best


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])  # labdist.parameter_server.store -> labdist.parameter_server


def violations(root: Path = ROOT) -> dict[str, list[str]]:
    """What breaks the contract, by rule (empty lists: it holds)."""
    found = imports_of(root)
    out: dict[str, list[str]] = {"unlayered": [], "upward": [], "worker_side": [],
                                 "private": [], "cycles": []}
    for imp in found:
        if imp.source == root.name:  # the package root re-exports the public API
            continue
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if dst is None and imp.target != root.name:
            out["unlayered"].append(f"{imp.where}: {imp.target} is in no layer")
        if src is None:
            out["unlayered"].append(f"{imp.where}: {imp.source} is in no layer")
            continue
        if dst is not None and dst < src and (imp.source, imp.target) not in ALLOWED_UPWARD:
            out["upward"].append(f"{imp.where}: {imp.source} ({LAYERS[src][0]}) imports "
                                 f"{imp.target} ({LAYERS[dst][0]})")
        if (LAYERS[src][0] in WORKER_SIDE and dst is not None
                and LAYERS[dst][0] not in WORKER_SIDE):
            out["worker_side"].append(f"{imp.where}: worker-side {imp.source} imports "
                                      f"driver-side {imp.target}")
        private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        if private and package_of(imp.source) != package_of(imp.target):
            out["private"].append(f"{imp.where}: {imp.source} imports {', '.join(private)} "
                                  f"from {imp.target}")
    out["cycles"] = [" -> ".join(c) for c in _cycles(found, root.name)]
    out["private_attributes"] = private_attributes(root)
    return out


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_receiver(node: ast.expr) -> bool:
    """`self`, `cls` or `super()`: the object's own attributes."""
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "super")


def _defined_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: bound at module level or in a class body (methods,
    class attributes, imports), or stored on `self` / `cls`."""
    names: set[str] = set()

    def bind(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(stmt.name)
                if isinstance(stmt, ast.ClassDef):
                    bind(stmt.body)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
            elif isinstance(stmt, ast.If | ast.Try | ast.With):
                bind([*stmt.body, *getattr(stmt, "orelse", [])])
            for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                if target is not None:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))

    bind(tree.body)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and _own_receiver(node.value)):
            names.add(node.attr)
    return {n for n in names if _is_private(n)}


def _touched(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each private attribute of another object: `obj._name` read, written or
    deleted, and `getattr` / `hasattr` / `setattr` / `delattr(obj, "_name")`."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _is_private(node.attr)
                and not _own_receiver(node.value)):
            found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
              and len(node.args) >= 2 and not _own_receiver(node.args[0])
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _is_private(node.args[1].value)):
            found.append((node.lineno, node.args[1].value))
    return found


def private_attributes(root: Path = ROOT) -> list[str]:
    """Where a module touches a private attribute no module of its own package defines.

    The rule reads names, not types: `obj._name` is fine where some module of the accessing
    package defines `_name` (a method or class attribute, `self._name = ...`, a module-level
    name), and an offence otherwise: the object is another package's (or another library's,
    save `DOCUMENTED_PRIVATE`). A name both packages define is not caught.
    """
    trees = {module_name(p, root): (p, tree) for p, tree in parsed(root)}
    defined: dict[str, set[str]] = {}
    for module, (_, tree) in trees.items():
        defined.setdefault(package_of(module), set()).update(_defined_names(tree))
    out = []
    for module, (path, tree) in trees.items():
        own = defined[package_of(module)]
        for line, name in _touched(tree):
            if name in own or name in DOCUMENTED_PRIVATE:
                continue
            owners = sorted(p for p, names in defined.items() if name in names)
            out.append(f"{path.relative_to(root.parent)}:{line}: {module} touches {name} of "
                       + (", ".join(owners) if owners else "another library"))
    return out


def _cycles(found: list[Import], root: str) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for imp in found:
        if imp.source != root and imp.target != root and imp.source != imp.target:
            graph.setdefault(imp.source, set()).add(imp.target)
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + "."):  # a package importing its own submodule
                continue
            if state.get(nxt) == "open":
                cycles.append([*path[path.index(nxt):], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


BACKEND_NAMES = {"numpy", "cupy", "strict"}  # Backend.name values
DEVICE_ARRAY_CLASSES = {"StrictDeviceArray"}


def backend_checks(root: Path = ROOT) -> list[str]:
    """Code outside `labdist/devices/` that tells backends apart instead of asking its
    Backend: a comparison (==, !=, in, match) with a backend name, or the double's array
    class named (as a name, an attribute, an import or inside a string)."""
    inside = f"{root.name}.devices"
    found = []
    for path, tree in parsed(root):
        module = module_name(path, root)
        if module == inside or module.startswith(inside + "."):
            continue
        relative = path.relative_to(root.parent)
        for node in ast.walk(tree):
            where = f"{relative}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare | ast.MatchValue):
                operands = ([node.left, *node.comparators] if isinstance(node, ast.Compare)
                            else [node.value])
                names = sorted(_strings(operands) & BACKEND_NAMES)
                if names:
                    found.append(f"{where}: compares with the backend name(s) {names}")
            named = (node.id if isinstance(node, ast.Name)
                     else node.attr if isinstance(node, ast.Attribute)
                     else node.value if isinstance(node, ast.Constant)
                     and isinstance(node.value, str) else None)
            if isinstance(node, ast.alias):
                named = node.name
            if named and any(c in named for c in DEVICE_ARRAY_CLASSES):
                found.append(f"{where}: names the strict double's array class ({named!r})")
    return found


def _strings(operands: list[ast.expr]) -> set[str]:
    """String constants among comparison operands, and inside tuple/list/set operands."""
    out: set[str] = set()
    for op in operands:
        items = op.elts if isinstance(op, ast.Tuple | ast.List | ast.Set) else [op]
        out |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return out


def test_no_code_outside_devices_asks_which_backend_it_has():
    broken = backend_checks()
    assert not broken, "ask the Backend instead:\n" + "\n".join(broken)


@pytest.fixture(scope="module")
def package_violations() -> dict[str, list[str]]:
    """The whole tree read once for every rule's case (each read takes seconds)."""
    return violations()


@pytest.mark.parametrize("rule", ["unlayered", "upward", "worker_side", "private", "cycles",
                                  "private_attributes"])
def test_the_package_keeps_its_layering(rule, package_violations):
    broken = package_violations[rule]
    assert not broken, f"{rule}:\n" + "\n".join(broken)


def test_every_module_is_in_a_layer():
    modules = {module_name(p, ROOT) for p in ROOT.rglob("*.py")} - {"labdist"}
    assert [m for m in sorted(modules) if layer_of(m) is None] == []


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "labdist"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return root


def test_the_checker_names_each_kind_of_offence(tmp_path):
    """The contract really fails: a fake package with one offence of each kind."""
    root = _fake_package(tmp_path, {
        "replica/actor.py": "from labdist.strategies.base import Strategy\n",
        "strategies/base.py": "from labdist.replica.actor import _secret\n"
                              "import labdist.variables\n",
        "variables.py": "def f():\n    from labdist.strategies import base\n",
        "collectives/algorithms.py": "from typing import TYPE_CHECKING\n"
                                     "if TYPE_CHECKING:\n"
                                     "    from labdist.training.model import Sequential\n",
        "elsewhere.py": "import labdist.enums\n",
    })
    found = violations(root)
    assert any("replica/actor.py:1" in v and "labdist.strategies.base" in v
               for v in found["upward"])
    assert any("worker-side labdist.replica.actor" in v for v in found["worker_side"])
    assert any("_secret" in v and "strategies/base.py:1" in v for v in found["private"])
    assert any("labdist.strategies.base" in c and "labdist.variables" in c
               for c in found["cycles"])
    assert any("labdist.elsewhere is in no layer" in v for v in found["unlayered"])
    assert not any("training" in v for vs in found.values() for v in vs)  # TYPE_CHECKING only


def test_the_backend_check_finds_each_way_of_asking(tmp_path):
    root = _fake_package(tmp_path, {
        "cluster/local.py": "def f(device):\n    return device == 'strict'\n",
        "collectives/nccl.py": "def f(b):\n    return b.name in ('cupy', 'x')\n",
        "worker/move.py": "def f(x):\n    return type(x).__name__ == 'StrictDeviceArray'\n",
        "worker/kind.py": "def f(b):\n    match b.name:\n        case 'numpy':\n"
                          "            return 1\n",
        "strategies/a.py": "from labdist.devices.strict.array import StrictDeviceArray\n",
        "devices/choice.py": "def f(device):\n    return device == 'strict'\n",  # its own
        "training/fit.py": "def f(xs):\n    return list(zip(xs, xs, strict=True))\n",
    })
    found = "\n".join(backend_checks(root))
    for where in ("cluster/local.py:2", "collectives/nccl.py:2", "worker/move.py:2",
                  "worker/kind.py:3", "strategies/a.py:1"):
        assert where in found, (where, found)
    assert "devices" not in found and "training" not in found


def test_the_checker_names_private_attributes_touched_across_packages(tmp_path):
    """Another package's `obj._name` (read, written or by getattr) fails, naming the file, line
    and the package that defines it; the object's own, its package's, and dunders do not."""
    root = _fake_package(tmp_path, {
        "cluster/group.py": "class Group:\n"
                            "    _kind = 'ps'\n"
                            "    def __init__(self):\n"
                            "        self._placement = {}\n"
                            "    def _move(self, other):\n"
                            "        return other._placement, self._kind\n",
        "cluster/user.py": "def f(group):\n    return group._move(group)\n",
        "strategies/base.py": "def f(group, point):\n"
                              "    a = group._placement\n"
                              "    group._kind = 'x'\n"
                              "    b = getattr(group, '_move')\n"
                              "    return point._fields, group.__class__, os._exit\n",
    })
    found = private_attributes(root)
    assert any("strategies/base.py:2:" in v and "_placement of labdist.cluster" in v
               for v in found), found
    assert any("strategies/base.py:3:" in v and "_kind" in v for v in found), found
    assert any("strategies/base.py:4:" in v and "_move" in v for v in found), found
    assert any("strategies/base.py:5:" in v and "_exit of another library" in v
               for v in found), found
    assert not any("cluster/" in v or "_fields" in v or "__class__" in v for v in found), found
    assert len(found) == 4
