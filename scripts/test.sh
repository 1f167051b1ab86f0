#!/usr/bin/env bash
# Sets up (installs missing Debian packages), builds with warnings as errors, runs every test,
# (with a private PostgreSQL cluster for the PostgreSQL storage tests), then the latency tests alone, the 200 MiB file test alone, the server's stop tests and
# vanishing long polls under AddressSanitizer, the capacity bench's short form (scripts/bench-capacity.sh --short), a short bounded
# run of each libFuzzer target (scripts/fuzz.sh --runs 20000) and of the API
# fuzzer against a real convkitd on each storage (scripts/fuzz-api.sh --max-examples 10 [--postgres]), and the folder kill soak
# (scripts/soak-folder.sh --kills 50).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build --build-tests -Xswiftc -warnings-as-errors
# The tests' PostgreSQL: a private cluster in a temporary directory, stopped on exit (each test
# makes a database of its own in it).
pg_dir=$(mktemp -d /tmp/convkit-pg.XXXXXX)
trap './scripts/pg-cluster.sh stop "$pg_dir"' EXIT
CONVKIT_TEST_POSTGRES=$(./scripts/pg-cluster.sh start "$pg_dir")
export CONVKIT_TEST_POSTGRES
# At most 8 tests at a time: every test shares the process's cooperative pool (two threads on two
# cores), and all 370 started at once left each in-process server, timer and pool waiting for tens
# of seconds (a 1 s long poll past its client's 16 s, a pool borrower past its 5 s); the run takes
# as long (CPU-bound either way: 518 s at once, 538 s by eight).
swift test --skip-build --experimental-maximum-parallelization-width 8
# Tests that measure latency run alone, on an otherwise idle machine; then the one that measures
# memory while it moves 200 MiB, alone too.
CONVKIT_TIMING_TESTS=1 swift test --skip-build --filter "hostileBodiesCostTheServerNeitherMemoryNorLatency|aMessageFromAnotherStoreShowsWithinTwoSeconds|typingShowsWithin200MillisecondsAndGoesWithinFiveSeconds"
CONVKIT_TIMING_TESTS=1 swift test --skip-build --filter "twoHundredMebibytesGoUpAndDown"
# The server's stop, under AddressSanitizer: no connection touched after the daemon is gone.
# (Leak checking is off: the test harness and Foundation keep a few hundred bytes to the end.)
swift build --build-tests --build-path .build/asan -Xswiftc -sanitize=address
ASAN_OPTIONS=detect_leaks=0 swift test --skip-build --build-path .build/asan \
  --filter "stopDuringLongPollsAndUploadsEndsCleanly|aServerDroppedWithoutStopStopsCleanly|pollsOfClientsThatVanishEndAtOnce"
# The capacity bench, short: 500 online clients, a fifth reconnecting, no error, every message.
./scripts/bench-capacity.sh --short
./scripts/fuzz.sh --runs 20000
./scripts/fuzz-api.sh --max-examples 10
./scripts/fuzz-api.sh --max-examples 10 --postgres
./scripts/soak-folder.sh --kills 50
