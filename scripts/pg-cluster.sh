#!/usr/bin/env bash
# A private PostgreSQL cluster for the tests: `pg-cluster.sh start DIR` makes one in DIR (initdb,
# trust authentication, a Unix socket in DIR, no TCP, fsync off) and prints its connection
# string (PG_FSYNC=on for a durable one, as the bench wants); `pg-cluster.sh stop DIR` stops it. PostgreSQL refuses to run as root: as root (CI), the
# cluster belongs to the `postgres` user Debian's package creates.
set -euo pipefail
command=${1:?usage: pg-cluster.sh start|stop DIR}
dir=${2:?usage: pg-cluster.sh start|stop DIR}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/initdb" ] || { echo "PostgreSQL is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "$command" in
start)
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
  port=$((20000 + RANDOM % 20000))
  as_owner "$bin/initdb" -D "$dir/data" -A trust -U convkit --no-sync -E UTF8 >/dev/null
  as_owner "$bin/pg_ctl" -D "$dir/data" -w -t 30 -l "$dir/log" \
    -o "-k $dir -c listen_addresses='' -p $port -c fsync=${PG_FSYNC:-off} -c max_connections=300" start >/dev/null
  echo "host=$dir port=$port user=convkit dbname=postgres"
  ;;
stop)
  as_owner "$bin/pg_ctl" -D "$dir/data" -w -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  ;;
*) echo "usage: pg-cluster.sh start|stop DIR" >&2; exit 64 ;;
esac
