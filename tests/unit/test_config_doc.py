"""docs/configuration.md's flag table says exactly what the flag table in the code says."""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.nsqd.options import FLAGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _doc_rows() -> list[list[str]]:
    """The cells of every row of the "All flags" table."""
    text = DOC.read_text()
    table = text[text.index("## All flags"):]
    rows = []
    for line in table.splitlines():
        if line.startswith("| `--"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


class ConfigDocTests(SynchronousTestCase):
    def test_same_flags_in_same_order(self) -> None:
        """Every flag of the code is in the doc, in the same order, and no other."""
        self.assertEqual([_unquote(r[0]) for r in _doc_rows()], [f"--{f.name}" for f in FLAGS])

    def test_toml_keys_defaults_and_status(self) -> None:
        """Each row's TOML key, default and status are the code's."""
        for flag, row in zip(FLAGS, _doc_rows(), strict=True):
            toml = "(command line only)" if flag.toml_key is None else f"`{flag.toml_key}`"
            self.assertEqual(row[1], toml, flag.name)
            default = flag.default_text
            if flag.name in ("node-id", "broadcast-address"):  # the value depends on the host
                default = default.split(" (")[0]
            self.assertEqual(_unquote(row[2]), default, flag.name)
            self.assertEqual(row[-1], flag.status, flag.name)
