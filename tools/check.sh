#!/usr/bin/env bash
# Lint and type checks, as CI runs them: ruff over the code and tests, mypy --strict
# (mypy.ini) over the package. Needs `pip install '.[lint]'`.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check nsqtw tests twisted benchmarks examples
mypy --strict nsqtw
