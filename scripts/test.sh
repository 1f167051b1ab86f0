#!/usr/bin/env bash
# Sets up (installs missing Debian packages), builds with warnings as errors, runs every test,
# then a short bounded run of each libFuzzer target (scripts/fuzz.sh --runs 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build --build-tests -Xswiftc -warnings-as-errors
swift test --skip-build
./scripts/fuzz.sh --runs 20000
