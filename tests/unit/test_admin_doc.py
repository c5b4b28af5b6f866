"""docs/admin.md's flag table says what nsqtw-admin's flag table in the code says."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from nsqtw._go.flags import Flag
from nsqtw.admin.options import FLAGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "admin.md"


def _rows() -> list[list[str]]:
    text = DOC.read_text()
    table = text[text.index("## Flags"):]
    return [[cell.strip() for cell in line.strip()[1:-1].split("|")]
            for line in table.splitlines() if line.startswith("| `--")]


def _plain(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def _default(flag: Flag) -> str:
    text = flag.default_text
    if flag.kind == "string":
        text = text[1:-1]
    return "none" if text in ("", "(none)") else text


class AdminDocTests(SynchronousTestCase):
    def test_same_flags_keys_and_defaults(self) -> None:
        """Every flag in order, each with the code's config key and default."""
        rows = _rows()
        self.assertEqual([_plain(r[0]) for r in rows], [f"--{f.name}" for f in FLAGS])
        for flag, row in zip(FLAGS, rows, strict=True):
            self.assertEqual(_plain(row[2]), flag.toml_key or "", flag.name)
            self.assertEqual(_plain(row[1]), _default(flag), flag.name)
