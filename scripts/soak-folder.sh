#!/usr/bin/env bash
# The folder kill soak: two machines (two copies of a shared folder kept in step by Unison), a
# store on each, and senders, syncing stores and Unison runs killed with SIGKILL at random moments.
# Midway, alice's store and her machine's folder copy are copied whole (`cp -a`) to a third
# machine, which goes on sending as alice too (kept in step with alice's machine by Unison), and
# senders run with their clocks jumped (hours ahead, minutes back) at random. At the end every
# message a sender saw synced ("acked") must be in every store exactly once, and SQLite's
# integrity check must pass on each.
# Usage: scripts/soak-folder.sh [--kills N] [--seed S] [--seconds S]   (CI: --kills 50)
set -euo pipefail
cd "$(dirname "$0")/.."
kills=1000
seed=$RANDOM
seconds=3600
while [ $# -gt 0 ]; do
  case "$1" in
    --kills) kills="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    *) echo "usage: scripts/soak-folder.sh [--kills N] [--seed S] [--seconds S]" >&2; exit 64 ;;
  esac
done
./scripts/setup.sh
swift build --product convkit-store-sync >/dev/null
tool=./.build/debug/convkit-store-sync
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/a/shared" "$work/b/shared" "$work/c" "$work/unison" "$work/acks"
RANDOM=$seed
start=$(date +%s)

# Both run as `exec` in a subshell when backgrounded, so that `$!` is the process itself.
store() {  # store <machine> <who> [args...]
  local machine=$1 who=$2; shift 2
  exec "$tool" --store "$work/$machine/$who" --folder "$work/$machine/shared" --device "$who" --identifier "$who" "$@"
}
unison_run() {  # unison_run [b|c]: machine a's folder copy with b's (default) or c's
  local other=${1:-b}
  UNISON="$work/unison" exec unison "$work/a/shared" "$work/$other/shared" -batch -silent -ignore 'Name .*.tmp' -perms 0 -times -ignorelocks
}
clock() {  # a clock jump now and then: up to 3 h ahead or 10 min back, else none
  case $(( RANDOM % 4 )) in
    0) echo "--clock-offset $(( RANDOM % 10800 ))" ;;
    1) echo "--clock-offset -$(( RANDOM % 600 ))" ;;
    *) echo "" ;;
  esac
}
copied=0

# Alice's machine creates the folder; Unison copies it; Bob joins.
(store a alice >/dev/null)
(unison_run >/dev/null)
(store b bob >/dev/null)

echo "soak-folder: $kills kills, seed $seed"
done_kills=0
for i in $(seq 1 "$kills"); do
  [ $(( $(date +%s) - start )) -ge "$seconds" ] && break
  # Halfway, alice's store and her folder copy move to machine c by a plain copy (nothing runs).
  if [ "$copied" -eq 0 ] && [ "$i" -ge $(( kills / 2 )) ]; then
    cp -a "$work/a/alice" "$work/c/alice"
    cp -a "$work/a/shared" "$work/c/shared"
    copied=1
  fi
  case $(( RANDOM % (copied == 1 ? 5 : 3) )) in
    0) (store a alice --send-to bob --count 20 --prefix "a$i" $(clock) >"$work/acks/a$i" 2>/dev/null) & ;;
    1) (store b bob --send-to alice --count 20 --prefix "b$i" $(clock) >"$work/acks/b$i" 2>/dev/null) & ;;
    2) (unison_run >/dev/null 2>&1) & ;;
    3) (store c alice --send-to bob --count 20 --prefix "c$i" $(clock) >"$work/acks/c$i" 2>/dev/null) & ;;
    4) (unison_run c >/dev/null 2>&1) & ;;
  esac
  pid=$!
  sleep "0.$(printf '%03d' $(( RANDOM % 400 )))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  done_kills=$((done_kills + 1))
done

# Let everything settle: sync both stores and the copies until nothing moves.
sides="a b"
[ "$copied" -eq 1 ] && sides="a b c"
for _ in 1 2 3; do
  (store a alice >/dev/null)
  if [ "$copied" -eq 1 ]; then
    (store c alice >/dev/null)
    (unison_run c >/dev/null 2>&1) || (unison_run c >/dev/null 2>&1) || true
  fi
  (unison_run >/dev/null 2>&1) || (unison_run >/dev/null 2>&1) || true
  (store b bob >/dev/null)
  (unison_run >/dev/null 2>&1) || true
done

(store a alice --check >"$work/check-a")
(store b bob --check >"$work/check-b")
[ "$copied" -eq 1 ] && (store c alice --check >"$work/check-c")
status=0
for side in $sides; do
  integrity=$(sed -n 's/^integrity //p' "$work/check-$side")
  [ "$integrity" = "ok" ] || { echo "soak-folder: integrity check on $side: $integrity" >&2; status=1; }
  duplicates=$(sed -n 's/^message \([^ ]*\) .*/\1/p' "$work/check-$side" | sort | uniq -d | head -3)
  [ -z "$duplicates" ] || { echo "soak-folder: messages twice on $side: $duplicates" >&2; status=1; }
done
acked=$( { cat "$work"/acks/* 2>/dev/null || true; } | sed -n 's/^acked //p' | sort -u)
missing=0
for side in $sides; do
  present=$(sed -n 's/^message \([^ ]*\) .*/\1/p' "$work/check-$side" | sort -u)
  lost=$(comm -23 <(echo "$acked" | sed '/^$/d') <(echo "$present"))
  if [ -n "$lost" ]; then
    echo "soak-folder: $(echo "$lost" | wc -l) acknowledged messages missing on $side, e.g. $(echo "$lost" | head -3 | tr '\n' ' ')" >&2
    missing=1
  fi
done
[ "$missing" -eq 0 ] || status=1
# (A run whose copied store never got to send has no c* files: cat fails, which is no failure.)
from_copy=$( { cat "$work"/acks/c* 2>/dev/null || true; } | sed -n 's/^acked //p' | sort -u | sed '/^$/d' | wc -l)
echo "soak-folder: $done_kills kills in $(( $(date +%s) - start )) s, $(echo "$acked" | sed '/^$/d' | wc -l) acknowledged messages ($from_copy from the copied store), seed $seed: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
