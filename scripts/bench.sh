#!/usr/bin/env bash
# Sets up, builds in release mode and runs the benchmark. Extra arguments go to convkit-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build -c release --product convkit-bench
swift build -c release --product convkitd  # the memory measurement runs it as a process
./.build/release/convkit-bench "$@"
