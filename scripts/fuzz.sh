#!/usr/bin/env bash
# Builds the libFuzzer targets (convkit-fuzz, with AddressSanitizer) and runs each from the seed
# corpus in Tests/FuzzCorpus. Usage: scripts/fuzz.sh [--runs N | --seconds S] [target...]
# Targets: record token header wire link image (default: all). A crash stops the run with the input
# saved as ./crash-*; turn it into a regression test. CI runs a short form (--runs 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
limit=(-runs=10000000)
case "${1:-}" in
  --runs) limit=(-runs="$2"); shift 2 ;;
  --seconds) limit=(-max_total_time="$2"); shift 2 ;;
esac
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(record token header wire link image)
swift build --build-path .build/fuzz -c release --product convkit-fuzz \
  -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING -Xswiftc -Xclang-linker -Xswiftc -fuse-ld=lld
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in "${targets[@]}"; do
  mkdir -p "$work/$target"
  cp Tests/FuzzCorpus/"$target"/* "$work/$target"/ 2>/dev/null || true
  start=$(date +%s)
  CONVKIT_FUZZ_TARGET="$target" ./.build/fuzz/release/convkit-fuzz "${limit[@]}" -max_len=65536 -print_final_stats=0 \
    "$work/$target" 2>"$work/$target.log" || { tail -30 "$work/$target.log"; echo "fuzz: $target failed" >&2; exit 1; }
  echo "fuzz: $target: $(grep -o 'Done [0-9]* runs' "$work/$target.log" | tail -1) in $(( $(date +%s) - start )) s"
done
