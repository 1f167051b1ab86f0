#!/usr/bin/env bash
# The capacity figures (docs/PERFORMANCE.md, "Ten thousand online"): convkit-bench --only capacity
# against the real convkitd (its clients each holding a stream; add --long-polls for the older
# clients), with the descriptor limit raised to the hard limit. Runs 10,000 online
# clients with senders at 1,000 messages/s for 30 s, then 5,000 with a fifth of them reconnecting
# every 2-4 s. Extra arguments go to every run (e.g. --window 60).
# --short: 500 clients for 3 s with churn, on the debug build (what CI runs: the bench exits 1 when
# a client saw an error or a message did not arrive).
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n "$(ulimit -Hn)"
if [ "${1:-}" = "--short" ]; then
    shift
    swift build --product convkitd >/dev/null
    swift build --product convkit-bench >/dev/null
    exec .build/debug/convkit-bench --only capacity --clients 500 --rate 200 --window 3 --churn 0.2 "$@"
fi
swift build -c release --product convkitd >/dev/null
swift build -c release --product convkit-bench >/dev/null
.build/release/convkit-bench --only capacity --clients 10000 --window 30 "$@"
.build/release/convkit-bench --only capacity --clients 5000 --window 30 --churn 0.2 "$@"
