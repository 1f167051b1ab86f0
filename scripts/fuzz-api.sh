#!/usr/bin/env bash
# Fuzzes a real convkitd with schemathesis (from PyPI, into .build/fuzz-api-venv) generated from
# the OpenAPI document, every request signed by scripts/fuzz_api_hooks.py. Fails on any 5xx, any
# status or header the document does not list, any body that breaks its schema, or a server that
# stops serving. Usage: scripts/fuzz-api.sh [--max-examples N] [--seed S] [--postgres]
# (--postgres: the server stores in a private PostgreSQL cluster, scripts/pg-cluster.sh, rather
# than SQLite; CI runs both with --max-examples 10)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
examples=100
seed=$RANDOM
postgres=no
while [ $# -gt 0 ]; do
  case "$1" in
    --max-examples) examples="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --postgres) postgres=yes; shift ;;
    *) echo "usage: scripts/fuzz-api.sh [--max-examples N] [--seed S] [--postgres]" >&2; exit 64 ;;
  esac
done

venv=.build/fuzz-api-venv
if ! "$venv/bin/st" --version 2>/dev/null | grep -q "4.32.5"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check schemathesis==4.32.5
fi

swift build --product convkitd
work=$(mktemp -d)
server=""
pg=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; [ -n "$pg" ] && ./scripts/pg-cluster.sh stop "$pg"; rm -rf "$work"' EXIT
storage=(--data "$work/data")
if [ "$postgres" = yes ]; then
  pg=$(mktemp -d /tmp/convkit-fuzz-pg.XXXXXX)  # its own, for the postgres user to own
  storage=(--storage "$(./scripts/pg-cluster.sh start "$pg")")
fi
./.build/debug/convkitd serve "${storage[@]}" --listen 127.0.0.1:0 --max-wait 1 2>"$work/server.log" &
server=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/server.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/server.log"; echo "fuzz-api: convkitd did not start" >&2; exit 1; }

export PYTHONPATH=scripts CONVKIT_FUZZ_IDENTITY="fuzz-$seed" CONVKIT_FUZZ_SEED
CONVKIT_FUZZ_SEED=$(python3 -c "import os; print(os.urandom(32).hex())")
"$venv/bin/python" -c "import fuzz_api_hooks, sys; fuzz_api_hooks.create_own_zone(sys.argv[1])" "http://127.0.0.1:$port"
echo "fuzz-api: convkitd on port $port ($([ "$postgres" = yes ] && echo PostgreSQL || echo SQLite) storage), seed $seed, $examples examples per operation"
SCHEMATHESIS_HOOKS=fuzz_api_hooks "$venv/bin/st" run Sources/ZoneServer/openapi.json \
  --url "http://127.0.0.1:$port" --seed "$seed" --max-examples "$examples" --workers 1 --generation-with-security-parameters false \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,unsupported_method,allow_header_conformance \
  --generation-allow-x00 true --generation-database none --no-color

# The server must still be serving, and must not have logged a failure.
python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=5)" "http://127.0.0.1:$port/healthz" || { echo "fuzz-api: the server stopped serving" >&2; exit 1; }
if grep -q " failed: 5" "$work/server.log"; then grep " failed: 5" "$work/server.log" | head; echo "fuzz-api: the server answered 5xx" >&2; exit 1; fi
echo "fuzz-api: clean"
