#!/usr/bin/env bash
# Builds the tools in release mode and installs them: convkit, convkitd and convkitd-sync (what
# `convkitd sync` runs) into <prefix>/bin
# (default /usr/local), the systemd units into <prefix>/lib/systemd/system.
# Usage: scripts/install.sh [--prefix DIR]   (DESTDIR is honoured for packaging)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
case "${1:-}" in
  --prefix) prefix="$2" ;;
  "") ;;
  -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
  *) echo "Error: unknown option '$1'" >&2; exit 64 ;;
esac
./scripts/setup.sh
swift build -c release --product convkit
swift build -c release --product convkitd
swift build -c release --product convkitd-sync
bin="${DESTDIR:-}$prefix/bin"
units="${DESTDIR:-}$prefix/lib/systemd/system"
install -d "$bin" "$units"
install -m 0755 .build/release/convkit .build/release/convkitd .build/release/convkitd-sync "$bin/"
install -m 0644 contrib/systemd/convkitd-serve.service contrib/systemd/convkitd-sync@.service "$units/"
echo "installed convkit, convkitd and convkitd-sync in $bin, the systemd units in $units"
