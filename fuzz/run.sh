#!/usr/bin/env bash
# fuzz/run.sh — builds the libFuzzer targets with clang in build-fuzz/ and runs each for SECONDS
# (default 60) from a scratch copy of its seed corpus (the repo is never modified).
# Exits non-zero if a target fails to build or any run crashes, leaks, times out or runs out of memory.
# Usage: fuzz/run.sh [SECONDS] [TARGET...]   (env: JOBS=2: build parallelism and targets run at once, FUZZ_BUILD=build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then TARGETS=(fuzz_gguf fuzz_safetensors fuzz_llama2c fuzz_tokenizer_json); fi
BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${JOBS:-2}

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DFASTPATH_FUZZ=ON -DFASTPATH_TESTS=OFF >/dev/null
ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]}"

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/fastpath-fuzz.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT

# One target's run; its exit status lands in $SCRATCH/$t.rc. libFuzzer runs one process per
# target, so JOBS targets run side by side (CI: 2 cores, 2 at a time).
fuzz_one() {
  local t=$1 corpus="$SCRATCH/$1"
  mkdir -p "$corpus" "$SCRATCH/artifacts/$t"
  if [ -d "fuzz/corpus/$t" ]; then cp -r "fuzz/corpus/$t/." "$corpus/"; fi
  echo "== $t: ${SECONDS_PER_TARGET}s from $(ls "$corpus" | wc -l) seeds"
  local rc=0
  "$BUILD/fuzz/$t" "$corpus" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$SCRATCH/artifacts/$t/" >"$SCRATCH/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$SCRATCH/$t.rc"
}
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait

failed=()
for t in "${TARGETS[@]}"; do
  if [ "$(cat "$SCRATCH/$t.rc" 2>/dev/null || echo 1)" != 0 ]; then
    failed+=("$t")
    tail -n 60 "$SCRATCH/$t.log"
    mkdir -p fuzz/corpus-out/"$t"   # git-ignored: keep the crashing inputs for reproduction
    cp "$SCRATCH/artifacts/$t/"* fuzz/corpus-out/"$t"/ 2>/dev/null || true
    echo "== $t FAILED (reproducer kept in fuzz/corpus-out/$t/; rerun: $BUILD/fuzz/$t FILE)"
  else
    echo -n "$t: "
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$SCRATCH/$t.log" | tr '\n' ' '
    echo
    echo "== $t ok"
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzzing found problems in: ${failed[*]}"
  exit 1
fi
