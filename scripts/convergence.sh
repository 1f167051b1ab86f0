#!/usr/bin/env bash
# The convergence property's long form (ConvergenceTests): N delivery schedules with fixed seeds
# (default 100,000; the suite runs 1,000), each ending in the view of a reader that received
# everything at once. Usage: scripts/convergence.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build --build-tests
CONVKIT_CONVERGENCE_SCHEDULES="${1:-100000}" swift test --skip-build --filter ConvergenceTests
