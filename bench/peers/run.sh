#!/usr/bin/env bash
# The side-by-side run against ejabberd, in one command (README.md beside this file):
#   bench/peers/run.sh                    the whole run (about 30 minutes on 2 cores)
#   N=30 N_BIG=60 REPS=1 REPS_BIG=1 LATENCY=2 SENDERS=3 PER=10 REPS_CONC=1 bench/peers/run.sh   a smoke test
# Installs what is missing (ejabberd, its PostgreSQL driver, slixmpp, PostgreSQL: Debian's),
# builds convkitd (release) in this checkout and the harness outside it, then runs
# run-ejabberd.sh. Needs root (PostgreSQL runs as `postgres`). Results: bench/peers/results/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}/convkit-peers-build}

"$ROOT/scripts/setup.sh" --build
missing=()
for p in ejabberd erlang-p1-pgsql python3-slixmpp postgresql curl; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "peers: installing ${missing[*]}" >&2
  # ejabberd's own service is not wanted: run-ejabberd.sh starts the server it measures.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

echo "peers: building convkitd and the harness (release)" >&2
(cd "$ROOT" && swift build -c release --product convkitd >/dev/null)
# The harness is a package of its own that depends on this checkout: built outside it.
mkdir -p "$SCRATCH"
rm -rf "$SCRATCH/harness" && cp -r "$HERE/harness" "$SCRATCH/harness"
(cd "$SCRATCH/harness" && CK_PROJECT="$ROOT" swift build -c release >/dev/null)

mkdir -p "$HERE/results"
CONVKITD="$ROOT/.build/release/convkitd" CK_PROJECT="$ROOT" CK_HARNESS="$SCRATCH/harness/.build/release/ck-harness" \
EJB_PY=/usr/bin/python3 OUT="${OUT:-$HERE/results/ejabberd-$(date -u +%Y-%m-%dT%H%M).txt}" exec "$HERE/run-ejabberd.sh"
