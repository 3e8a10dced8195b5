#!/usr/bin/env bash
# bench/timed_choice_ab.sh — whole-model prefill with each candidate of the timed matmul choice
# forced in turn, interleaved round by round (machines here are noisy: compare within a round).
#
# The candidates of a timed choice (registry.h) cannot be forced with --kernel, which forces one
# kernel for every shape class (decode too). Instead each configuration gets a cache directory
# (XDG_CACHE_HOME) whose kernel_choices.json is this machine's, with the named kernel made the
# winner of every prefill (gemm) class it contends in. Run a model once normally first, so that
# the file holds its classes.
#
#   [PROMPT=512] bench/timed_choice_ab.sh MODEL[,MODEL...] KERNEL[,KERNEL...] [ROUNDS] [extra bench args]
#   e.g. bench/timed_choice_ab.sh /work/models/llama1b-q4_0.gguf avx512bf16,avx512vnni,amxbf16 3
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:?models}; kernels=${2:?kernels}; rounds=${3:-3}; shift 3 || shift $#
src=${XDG_CACHE_HOME:-$HOME/.cache}/fastpath
[ -f "$src/kernel_choices.json" ] || { echo "no $src/kernel_choices.json: run the models once first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
IFS=, read -ra K <<<"$kernels"
IFS=, read -ra M <<<"$models"
for k in "${K[@]}"; do
  mkdir -p "$work/$k/fastpath"
  cp "$src/ceiling.json" "$work/$k/fastpath/" 2>/dev/null || true
  python3 - "$src/kernel_choices.json" "$work/$k/fastpath/kernel_choices.json" "$k" <<'EOF'
import json, sys
src, dst, kernel = sys.argv[1:]
j = json.load(open(src))
for machine in j.values():
    for key, e in machine.items():
        if " gemm" in key and kernel in e["times_ms"]:
            e["times_ms"][kernel] = 0.0
            e["winner"] = kernel
json.dump(j, open(dst, "w"), indent=2)
EOF
done
for r in $(seq 1 "$rounds"); do
  for m in "${M[@]}"; do
    for k in "${K[@]}"; do
      tps=$(XDG_CACHE_HOME="$work/$k" build/fastpath bench -q -m "$m" -p "${PROMPT:-512}" -n 0 -r 3 "$@" 2>/dev/null | awk '/^prefill/ {print $3}')
      echo "round $r  $(basename "$m")  $k  prefill ${tps:-failed} tok/s"
    done
  done
done
