#!/usr/bin/env bash
# scripts/test.sh — set up, build, and run the whole test suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
ctest --test-dir build --output-on-failure -j "$(nproc)"
