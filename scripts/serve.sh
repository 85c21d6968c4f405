#!/usr/bin/env bash
# Runs a broker with its coordinator on the embedded metadata store (./data), installing first if
# needed: .venv with the project alone (no extras, no Debian packages: README, Two commands).
# Arguments go to `coordinator serve` (see `coordinator serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS= TEST_PACKAGES=no scripts/bootstrap.sh
exec .venv/bin/coordinator serve "$@"
