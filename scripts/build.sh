#!/usr/bin/env bash
# scripts/build.sh [BUILD_DIR] [cmake args...] — configure (once) and build with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
# Configure once; again whenever cmake arguments are given (an existing build directory takes them).
if [ ! -f "$dir/build.ninja" ] || [ $# -gt 0 ]; then cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"; fi
cmake --build "$dir" -j "$(nproc)"
