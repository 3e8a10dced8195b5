#!/usr/bin/env bash
# bench/run_1b.sh [MODEL_DIR] — the Llama-3.2-1B-shape end-to-end benchmark: writes random-weight
# models with `fastpath synth` (once, into MODEL_DIR, default /tmp/fastpath-models), then runs
# `fastpath bench -p 512 -n 128 -t 2` on each weight type and `audit --strict` on each. Decode is
# shown against the largest read bandwidth ever probed and against the median probe beside its runs.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/fastpath-models}
types=${TYPES:-"f16 bf16 q8_0 q4_k"}
mkdir -p "$dir"
for t in $types; do
  m="$dir/llama1b-$t.gguf"
  [ -f "$m" ] || build/fastpath synth --arch llama --config bench/llama1b.json --type "$t" --out "$m"
done
printf '%-6s %12s %10s %12s %10s %16s %10s\n' type prefill_tps fraction decode_tps fraction read_beside_gbps fraction
for t in $types; do
  m="$dir/llama1b-$t.gguf"
  j=$(build/fastpath bench -q --json -m "$m" -p "${PROMPT:-512}" -n "${GEN:-128}" -t 2 -r "${REPS:-3}")
  python3 -c "import json,sys; j=json.loads(sys.argv[1]); print('%-6s %12.2f %9.1f%% %12.2f %9.1f%% %16.1f %9.1f%%' % (sys.argv[2], j['prefill_tps'], 100*j['prefill_ceiling_fraction'], j['decode_tps'], 100*j['decode_ceiling_fraction'], j['decode_read_gbps_beside'], 100*j['decode_beside_fraction']))" "$j" "$t"
done
for t in $types; do
  build/fastpath audit -q --strict -m "$dir/llama1b-$t.gguf" -t 2 > /dev/null && echo "audit --strict $t: no fallbacks"
done
