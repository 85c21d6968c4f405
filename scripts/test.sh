#!/usr/bin/env bash
# The one test command (README, .ci/run): installs everything from nothing, then lint, types, tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k rebalance -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,dev,spark,bench scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== pytest"; pytest "$@"
