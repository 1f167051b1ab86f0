#!/usr/bin/env bash
# The main job: sets up, builds in release mode and runs `convkit demo` (alice and bob through a
# shared folder in a temporary directory, every step checked; exit 0 only if all held).
# Arguments go to `convkit demo` (e.g. --dir DIR --keep).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build -c release --product convkit
exec ./.build/release/convkit demo "$@"
