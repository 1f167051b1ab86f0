#!/usr/bin/env bash
# Sets up (installs missing Debian packages), builds with warnings as errors, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build --build-tests -Xswiftc -warnings-as-errors
swift test --skip-build
