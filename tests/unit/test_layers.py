"""Lower layers never import upper ones (docs/architecture.md's layering, checked on the source).

Every ``import`` of every module is read with ``ast``, including imports
under ``if TYPE_CHECKING:`` and inside functions: a layer that only
*mentions* an upper one for types still depends on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

PACKAGE = Path(__file__).resolve().parents[2] / "nsqtw"

#: package -> module prefixes it must not import
FORBIDDEN = {
    # the message core knows storage, protocols and programs only through nsqtw.interfaces
    "core": ("nsqtw.storage", "nsqtw.nsqd", "nsqtw.protocol", "nsqtw.http", "nsqtw.net",
             "nsqtw.lookupd", "nsqtw.spark", "nsqtw.tools"),
    # storage sits under the protocols and programs
    "storage": ("nsqtw.nsqd", "nsqtw.protocol", "nsqtw.http", "nsqtw.net", "nsqtw.lookupd",
                "nsqtw.spark", "nsqtw.tools"),
    # nsqlookupd shares the Go-compatible pieces with nsqd, and nothing of nsqd itself
    "lookupd": ("nsqtw.nsqd", "nsqtw.core", "nsqtw.storage", "nsqtw.protocol.v2", "nsqtw.observe",
                "nsqtw.spark", "nsqtw.tools"),
    # the Go ports are pure: nothing of nsqtw but each other and the log-level table
    "_go": ("nsqtw.core", "nsqtw.storage", "nsqtw.nsqd", "nsqtw.protocol", "nsqtw.http", "nsqtw.net",
            "nsqtw.lookupd", "nsqtw.observe", "nsqtw.spark", "nsqtw.tools"),
    "http": ("nsqtw.nsqd", "nsqtw.core", "nsqtw.storage", "nsqtw.protocol", "nsqtw.lookupd"),
    # the client library speaks the wire protocol; it knows nothing of the daemons' insides
    "client": ("nsqtw.nsqd", "nsqtw.core", "nsqtw.storage", "nsqtw.protocol.v2", "nsqtw.protocol.identify",
               "nsqtw.lookupd", "nsqtw.observe", "nsqtw.spark", "nsqtw.tools", "nsqtw.http"),
    "net": ("nsqtw.nsqd", "nsqtw.core", "nsqtw.storage", "nsqtw.protocol", "nsqtw.lookupd", "nsqtw.http"),
    # nsqadmin talks to the cluster over HTTP only: nothing of nsqd, nsqlookupd or the message core
    "admin": ("nsqtw.nsqd", "nsqtw.core", "nsqtw.storage", "nsqtw.lookupd", "nsqtw.protocol.v2",
              "nsqtw.protocol.wire", "nsqtw.observe", "nsqtw.spark", "nsqtw.tools"),
}

# no program imports the admin, and the admin is above everything it uses
for _package in ("core", "storage", "lookupd", "_go", "http", "net"):
    FORBIDDEN[_package] = FORBIDDEN[_package] + ("nsqtw.admin",)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (``from x import y`` counts as ``x`` and ``x.y``)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


class LayerTests(SynchronousTestCase):
    def test_no_upward_imports(self) -> None:
        """No module of a layer imports a layer above it."""
        broken = []
        for package, forbidden in FORBIDDEN.items():
            for path in sorted((PACKAGE / package).rglob("*.py")):
                for name in sorted(imports_of(path)):
                    if name.startswith(forbidden):
                        broken.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
        self.assertEqual(broken, [])

    def test_checker_sees_type_checking_imports(self) -> None:
        """The check reads imports under ``if TYPE_CHECKING:`` too (it would catch a hidden one)."""
        sample = PACKAGE / "core" / "topic.py"
        self.assertIn("nsqtw.core.channel", imports_of(sample))
