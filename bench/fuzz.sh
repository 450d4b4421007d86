#!/usr/bin/env bash
# Fuzzes every parser the project owns (tests/fuzz: Node tokens, names, secret values, keys,
# knobs, request bodies and queries) with bolero's random engine, on the stable toolchain,
# in release mode, for a bounded time:
#   bash bench/fuzz.sh [seconds per target, default 60]
# Targets run one after another, each of their checks for that long: about 10 x seconds in all.
# A failure prints BOLERO_RANDOM_SEED=<n>; replay it with
#   BOLERO_RANDOM_SEED=<n> cargo test -p tests --test fuzz <target>
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
case "$seconds" in
    ''|*[!0-9]*) echo "usage: bash bench/fuzz.sh [seconds per target]" >&2; exit 2 ;;
esac
echo "fuzz: every target for ${seconds} s, release build"
BOLERO_RANDOM_TEST_TIME_MS=$((seconds * 1000)) \
    cargo test --release -p tests --test fuzz -- --test-threads=1
