#!/usr/bin/env bash
# Sets up, builds in release mode and runs the zone server. Arguments go to `convkitd serve`
# (default: --data ./convkitd-data --listen 127.0.0.1:8080).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build -c release --product convkitd
if [ "$#" -eq 0 ]; then set -- --data ./convkitd-data --listen 127.0.0.1:8080; fi
exec ./.build/release/convkitd serve "$@"
