#!/usr/bin/env bash
# The CLI's own figures (docs/PERFORMANCE.md): each command a new process, as a user runs it;
# wall time of 10 runs, median (min, max). Over a folder, then over convkitd serve on loopback.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
(cd "$ROOT" && swift build -c release --product convkit >/dev/null && swift build -c release --product convkitd >/dev/null)
CK=$ROOT/.build/release/convkit; CKD=$ROOT/.build/release/convkitd
W=$(mktemp -d /tmp/clibench.XXXXXX); cd "$W"
SP=
trap '[ -n "$SP" ] && kill "$SP" 2>/dev/null; rm -rf "$W"' EXIT
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; local e=$(date +%s.%N); awk -v s="$s" -v e="$e" 'BEGIN { print e - s }'; }
med() { sort -n | awk '{a[NR]=$1} END {printf "%.0f ms (min %.0f, max %.0f)", a[int((NR+1)/2)]*1000, a[1]*1000, a[NR]*1000}'; }
$CK init --id alice --name Alice --zone-dir ./shared --device laptop --store ./alice >/dev/null
$CK init --id bob --name Bob --zone-dir ./shared --device phone --store ./bob >/dev/null
$CK send bob "hello" --sync --store ./alice >/dev/null; $CK sync --store ./bob >/dev/null
echo "folder: send --sync    $(for i in $(seq 10); do t $CK send bob "message $i" --sync --store ./alice; done | med)"
echo "folder: sync (receive) $(for i in $(seq 10); do $CK send alice "reply $i" --sync --store ./bob >/dev/null; t $CK sync --store ./alice; done | med)"
echo "folder: messages       $(for i in $(seq 10); do t $CK messages bob --store ./alice; done | med)"
$CKD serve --data ./server --listen 127.0.0.1:0 2> serve.log & SP=$!
for i in $(seq 50); do grep -q 'listening on' serve.log && break; sleep 0.1; done
PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' serve.log | head -1 | sed 's/.*://')
$CK init --id carol --name Carol --server http://127.0.0.1:$PORT --store ./carol >/dev/null
$CK init --id dave --name Dave --server http://127.0.0.1:$PORT --store ./dave >/dev/null
$CK send dave "hello" --sync --store ./carol >/dev/null; $CK sync --store ./dave >/dev/null
echo "server: send --sync    $(for i in $(seq 10); do t $CK send dave "message $i" --sync --store ./carol; done | med)"
echo "server: sync (receive) $(for i in $(seq 10); do $CK send carol "reply $i" --sync --store ./dave >/dev/null; t $CK sync --store ./carol; done | med)"
echo "server: messages       $(for i in $(seq 10); do t $CK messages dave --store ./carol; done | med)"
echo "process start: convkit --help $(for i in $(seq 10); do t $CK --help; done | med)"
