#!/usr/bin/env bash
# bench/serve_peers.sh — `fastpath bench-serve` against `fastpath serve` and against
# llama-cpp-python's OpenAI server on the same GGUF file, one after the other in one run, then
# the two results side by side (table + SVG). Random prompts of exact token counts, every
# request generating its full length (--ignore-eos).
#
#   MODEL=/work/models/llama1b-q8_0.gguf PY=/work/.venv-peers/bin/python bench/serve_peers.sh
#
# PY is a Python with `llama-cpp-python[server]` installed (pip builds it from source; PyPI has
# no wheel). Results go to $OUT (default bench/out/serve_peers, not committed).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a .gguf file}
PY=${PY:-python3}
THREADS=${THREADS:-2}
CONC=${CONC:-1,4,16}
PROMPTS=${PROMPTS:-8,16,32}      # requests per concurrency level
IN=${IN:-256}
OUTLEN=${OUTLEN:-128}
OUT=${OUT:-bench/out/serve_peers}
PEER_PORT=${PEER_PORT:-8091}
mkdir -p "$OUT"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_http() {  # URL, seconds
  for _ in $(seq 1 "$2"); do
    if curl -sf -o /dev/null "$1"; then return 0; fi
    sleep 1
  done
  echo "no answer from $1 after $2 s" >&2
  return 1
}

load() {  # PORT NAME
  build/fastpath bench-serve -q --port "$1" -m "$MODEL" --ignore-eos --num-warmups 1 --num-prompts "$PROMPTS" \
    --max-concurrency "$CONC" --random-input-len "$IN" --random-output-len "$OUTLEN" --request-timeout 3600 \
    --json "$OUT/$2.json" --svg "$OUT/$2.svg" | tee "$OUT/$2.txt"
}

echo "== fastpath serve ($MODEL, $THREADS threads)"
rm -f "$OUT/fastpath.port"
build/fastpath serve -q -m "$MODEL" -t "$THREADS" --host 127.0.0.1 --port 0 --port-file "$OUT/fastpath.port" \
  --max-num-seqs 16 --kv-cache-memory 4GiB --max-model-len 4096 &
pids+=($!)
for _ in $(seq 1 300); do
  [ -s "$OUT/fastpath.port" ] && break
  kill -0 "${pids[-1]}" 2>/dev/null || { echo "fastpath serve exited (see its error above)" >&2; exit 1; }
  sleep 1
done
port=$(cat "$OUT/fastpath.port")
wait_http "http://127.0.0.1:$port/health" 300
load "$port" fastpath
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

echo "== llama-cpp-python server ($("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)'), $THREADS threads)"
"$PY" -m llama_cpp.server --model "$MODEL" --n_threads "$THREADS" --n_threads_batch "$THREADS" --n_ctx 4096 \
  --host 127.0.0.1 --port "$PEER_PORT" > "$OUT/llama-cpp-python.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$PEER_PORT/v1/models" 600
load "$PEER_PORT" llama-cpp-python
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

echo "== side by side"
build/fastpath bench-serve --compare "$OUT/fastpath.json,$OUT/llama-cpp-python.json" --labels fastpath,llama-cpp-python \
  --svg "$OUT/compare.svg" | tee "$OUT/compare.txt"
