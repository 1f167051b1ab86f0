#!/usr/bin/env bash
# Sets up, builds in release mode and runs the benchmark. Extra arguments go to convkit-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build -c release --product convkit-bench
swift build -c release --product convkitd  # the memory measurement runs it as a process
# The postgres section's database: a private cluster in a temporary directory, durable (fsync
# on, as SQLite's synchronous=FULL), stopped on exit.
pg_dir=$(mktemp -d /tmp/convkit-bench-pg.XXXXXX)
trap './scripts/pg-cluster.sh stop "$pg_dir"' EXIT
postgres=$(PG_FSYNC=on ./scripts/pg-cluster.sh start "$pg_dir")
./.build/release/convkit-bench --postgres "$postgres" "$@"
