#!/usr/bin/env bash
# Runs a broker with its coordinator on the embedded metadata store (./data), installing first if
# needed. Arguments go to `coordinator serve` (see `coordinator serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,dev scripts/bootstrap.sh
exec .venv/bin/coordinator serve "$@"
