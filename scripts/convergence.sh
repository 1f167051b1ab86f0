#!/usr/bin/env bash
# The convergence properties' long form: N delivery schedules with fixed seeds (default 100,000;
# the suite runs 1,000 of ConvergenceTests, 200 of GroupConvergenceTests, 1,000 membership
# histories of GroupMembershipTests and 1,000 encryption schedules of EncryptionPropertyTests), each ending in the view of a reader that received
# everything at once. Usage: scripts/convergence.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
swift build --build-tests
N="${1:-100000}"
CONVKIT_CONVERGENCE_SCHEDULES="$N" CONVKIT_GROUP_CONVERGENCE_SCHEDULES="$N" CONVKIT_GROUP_SCHEDULES="$N" CONVKIT_ENCRYPTION_SCHEDULES="$N" \
    swift test --skip-build --filter 'ConvergenceTests|GroupMembershipTests|EncryptionPropertyTests'
