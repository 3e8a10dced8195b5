#!/usr/bin/env bash
# scripts/build.sh [BUILD_DIR] [cmake args...] — configure (once) and build with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
[ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$dir" -j "$(nproc)"
