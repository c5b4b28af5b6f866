"""Lower layers never import upper ones, modules import no cycle, and none is over 700 lines
(docs/architecture.md's layering).

Every ``import`` of every module is read with ``ast``, including imports
under ``if TYPE_CHECKING:`` and inside functions: a layer that only
*mentions* an upper one for types still depends on it. ``from a import b``
counts as the module ``a.b`` when there is one, else as ``a``. Lines are
counted as ``wc -l`` counts them.
"""

from __future__ import annotations

import ast
import shutil
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

PACKAGE = Path(__file__).resolve().parents[2] / "nsqtw"

#: the base modules: everything may import them (docs/architecture.md's first row)
BASE = ("nsqtw.errors", "nsqtw.interfaces", "nsqtw.log", "nsqtw.names", "nsqtw.heap", "nsqtw.speedups")

#: each package or base module -> what of nsqtw it may import besides itself and the
#: package root (``nsqtw/__init__.py``: the version); prefixes end at a dot or the name
ALLOWED: dict[str, tuple[str, ...]] = {
    # the seams: nothing of nsqtw, so every layer can import them
    "interfaces": (),
    "errors": (),
    "names": (),
    "heap": (),
    "speedups": (),
    "log": (),
    # the Go ports are pure: nothing of nsqtw but each other and the log-level table
    "_go": ("nsqtw.log",),
    # the message core knows storage, protocols and programs only through nsqtw.interfaces
    "core": BASE + ("nsqtw.observe.quantile",),
    # storage sits under the protocols and programs
    "storage": BASE + ("nsqtw.core",),
    "observe": BASE + ("nsqtw._go",),
    "net": BASE,
    # http reads twisted.web's private names only through the one module that lists them
    "http": BASE + ("nsqtw._go", "nsqtw.net.twisted_privates"),
    "protocol": BASE + ("nsqtw._go", "nsqtw.core", "nsqtw.net"),
    # nsqlookupd shares the Go-compatible pieces with nsqd, and nothing of nsqd itself
    "lookupd": BASE + ("nsqtw._go", "nsqtw.http", "nsqtw.net", "nsqtw.protocol.wire"),
    # a worker process serves V2 connections; the core's side of its link runs their commands
    "workers": BASE + ("nsqtw.core", "nsqtw.net", "nsqtw.protocol"),
    # replication (--replicas=2) copies the message core's messages; the node reaches it through
    # nsqtw.interfaces.IReplication; its files are replaced whole the one way storage's are
    "replica": BASE + ("nsqtw.core", "nsqtw.net", "nsqtw.storage.atomic"),
    "nsqd": BASE + ("nsqtw._go", "nsqtw.core", "nsqtw.storage", "nsqtw.observe", "nsqtw.net", "nsqtw.http",
                    "nsqtw.protocol", "nsqtw.lookupd", "nsqtw.workers", "nsqtw.replica"),
    # nsqadmin talks to the cluster over HTTP only: nothing of nsqd, nsqlookupd or the message core
    "admin": BASE + ("nsqtw._go", "nsqtw.http", "nsqtw.net", "nsqtw.protocol.auth"),
    # the client library speaks the wire protocol; it knows nothing of the daemons' insides
    "client": BASE + ("nsqtw._go", "nsqtw.net", "nsqtw.protocol.wire", "nsqtw.protocol.compress"),
    "spark": BASE + ("nsqtw.core.message", "nsqtw.protocol.wire"),
    "tools": BASE + ("nsqtw._go", "nsqtw.protocol.wire", "nsqtw.client", "nsqtw.storage.executor", "nsqtw.net.exit"),
}

#: the most lines (``wc -l``) a module under nsqtw/ may have; a longer one is split by concept
MAX_MODULE_LINES = 700

#: import cycles there today, each through a lazy import (a module loaded on first use) or a
#: type-only one; a new cycle fails the test
KNOWN_CYCLES: list[list[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    """Every module of nsqtw that ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if _is_module(name) else node.module)
    return {name for name in found if name.split(".")[0] == "nsqtw"}


def layer_of(path: Path) -> str:
    """The package (or base module) a module belongs to: ``core``, ``interfaces``, ..."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def forbidden(layer: str, names: set[str]) -> list[str]:
    """Those of ``names`` (modules imported by a module of ``layer``) that the layering forbids."""
    own = f"nsqtw.{layer}"
    allowed = ALLOWED[layer]
    return [name for name in sorted(names)
            if name != "nsqtw" and name != own and not name.startswith(own + ".")
            and not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)]


def upward_imports(paths: list[Path]) -> list[str]:
    """``module imports name`` for each import the layering forbids."""
    return [f"{module_name(path)} imports {name}" for path in paths
            for name in forbidden(layer_of(path), imports_of(path))]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def line_count(path: Path) -> int:
    """The lines of ``path`` as ``wc -l`` counts them: its newline characters."""
    return path.read_bytes().count(b"\n")


def long_modules(paths: list[Path], limit: int = MAX_MODULE_LINES, root: Path = PACKAGE.parent) -> list[str]:
    """``path (n lines)`` for each of ``paths`` over ``limit`` lines, the path relative to ``root``."""
    return [f"{path.relative_to(root)} ({n} lines)" for path in paths if (n := line_count(path)) > limit]


class LayerTests(SynchronousTestCase):
    def test_every_package_has_a_rule(self) -> None:
        """Every package and base module under nsqtw/ is in the layering (a new one must be placed)."""
        layers = {layer_of(path) for path in all_modules() if path.name != "__init__.py" or path.parent != PACKAGE}
        self.assertEqual(sorted(layers - set(ALLOWED)), [])
        self.assertEqual(sorted(set(ALLOWED) - layers), [])

    def test_no_upward_imports(self) -> None:
        """No module of a layer imports a layer above it."""
        self.assertEqual(upward_imports([p for p in all_modules() if p != PACKAGE / "__init__.py"]), [])

    def test_interfaces_import_nothing_of_nsqtw(self) -> None:
        """The interfaces module imports nothing of nsqtw (every layer imports it)."""
        self.assertEqual(imports_of(PACKAGE / "interfaces.py"), set())

    def test_no_new_import_cycle(self) -> None:
        """No module imports one that imports it back, directly or around a loop; a type that
        would need one goes through an interface (nsqtw.interfaces, or a Protocol)."""
        graph = {module_name(path): imports_of(path) for path in all_modules()}
        self.assertEqual(cycles(graph), KNOWN_CYCLES)

    def test_no_module_over_the_line_limit(self) -> None:
        """No module under nsqtw/ is over MAX_MODULE_LINES lines (``wc -l``): a longer one is split
        into modules by concept (docs/architecture.md)."""
        long = long_modules(all_modules())
        if long:
            self.fail(f"modules over {MAX_MODULE_LINES} lines (split them by concept): {', '.join(long)}")

    def test_line_limit_counts_as_wc_does(self) -> None:
        """A module of exactly the limit passes and one line more is named, with its count; a last
        line without a newline is not counted (as ``wc -l`` does not)."""
        sample = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, sample)
        at, over, unterminated = sample / "at.py", sample / "over.py", sample / "unterminated.py"
        at.write_text("x = 1\n" * 5)
        over.write_text("x = 1\n" * 6)
        unterminated.write_text("x = 1\n" * 5 + "x = 1")
        self.assertEqual(line_count(unterminated), 5)
        self.assertEqual(long_modules([at, over, unterminated], limit=5, root=sample), ["over.py (6 lines)"])

    def test_checker_sees_type_checking_imports(self) -> None:
        """The check reads imports under ``if TYPE_CHECKING:`` too (it would catch a hidden one)."""
        self.assertIn("nsqtw.core.channel", imports_of(PACKAGE / "core" / "topic.py"))

    def test_checker_catches_what_it_must(self) -> None:
        """A type-only import of storage in core, core in the interfaces, nsqd in the client, and a
        loop of three modules are each reported; a package's own modules and the root are not."""
        sample = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, sample)
        core = sample / "core.py"
        core.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nsqtw.storage import durable\n")
        self.assertEqual(forbidden("core", imports_of(core)), ["nsqtw.storage.durable"])
        self.assertEqual(forbidden("interfaces", {"nsqtw.core.topic", "nsqtw"}), ["nsqtw.core.topic"])
        self.assertEqual(forbidden("client", {"nsqtw.nsqd.service", "nsqtw.client.conn"}), ["nsqtw.nsqd.service"])
        self.assertEqual(forbidden("storage", {"nsqtw.core.message", "nsqtw.interfaces"}), [])
        self.assertEqual(cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}), [["a", "b", "c"]])
