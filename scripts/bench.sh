#!/usr/bin/env bash
# Sets up, builds in release mode and runs the benchmark. Extra arguments go to convkit-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build -c release --product convkit-bench
./.build/release/convkit-bench "$@"
