#!/usr/bin/env bash
# Sets up (installs missing Debian packages), builds with warnings as errors, runs every test,
# then a short bounded run of each libFuzzer target (scripts/fuzz.sh --runs 20000) and of the API
# fuzzer against a real convkitd (scripts/fuzz-api.sh --max-examples 10).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build --build-tests -Xswiftc -warnings-as-errors
swift test --skip-build
# Tests that measure latency run alone, on an otherwise idle machine.
CONVKIT_TIMING_TESTS=1 swift test --skip-build --filter hostileBodiesCostTheServerNeitherMemoryNorLatency
./scripts/fuzz.sh --runs 20000
./scripts/fuzz-api.sh --max-examples 10
