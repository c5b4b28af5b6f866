"""benchmarks/ and docs/performance.md: every script documented, none reaching outside the checkout by default,
and every test the performance report cites real."""

from __future__ import annotations

import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"

#: how a default path outside the repository was written (the Go binaries of a workspace beside the checkout)
OUTSIDE = re.compile(r"""["']\.\.["']\s*,\s*["']\.\.|["']\.\.["']\s*,\s*["']shared["']|\.\./shared|/work/""")


class BenchmarksTests(SynchronousTestCase):
    def scripts(self) -> list[Path]:
        found = sorted(p for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh"))
        self.assertTrue(found, "benchmarks/ holds no script")
        return found

    def test_every_script_is_in_the_readme(self) -> None:
        """benchmarks/README.md names every script in benchmarks/ (what it measures, how to run it)."""
        readme = (BENCHMARKS / "README.md").read_text()
        for script in self.scripts():
            self.assertIn(f"`{script.name}`", readme, f"{script.name} is not in benchmarks/README.md")

    def test_the_readme_names_only_scripts_that_exist(self) -> None:
        """Every script benchmarks/README.md lists is there."""
        readme = (BENCHMARKS / "README.md").read_text()
        for name in set(re.findall(r"^\| `([\w.]+\.(?:py|sh))`", readme, re.M)):
            self.assertTrue((BENCHMARKS / name).is_file(), f"benchmarks/README.md lists {name}")

    def test_no_default_path_outside_the_checkout(self) -> None:
        """No script defaults to a path outside the repository: the Go binaries are a required argument."""
        for script in self.scripts():
            for number, line in enumerate(script.read_text().splitlines(), 1):
                self.assertIsNone(OUTSIDE.search(line), f"{script.name}:{number}: {line.strip()}")

    def test_performance_doc_names_real_tests(self) -> None:
        """Every test file and test docs/performance.md cites exists."""
        text = (ROOT / "docs" / "performance.md").read_text()
        cited = set(re.findall(r"`(tests/[\w/]+\.py)((?:::\w+)*)`", text))
        self.assertTrue(cited)
        for path, names in cited:
            source = (ROOT / path).read_text()
            for name in filter(None, names.split("::")):
                found = re.search(rf"\b(def|class) {name}\b", source)
                self.assertIsNotNone(found, f"performance.md cites {path}{names}")
