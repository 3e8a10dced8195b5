#!/usr/bin/env bash
# bench/device_check.sh — the CUDA backend's whole check on the GPU machine, in one device call
# (issue 8). Prepare first, here: bench/device_prepare.sh (builds, packs device-bundle/), then
#   run(command="bash bench/device_check.sh", carry=["device-bundle"], timeout_s=480)
# and, if that call ran out of time before the MoE shapes, a second with "bash bench/device_check.sh moe".
# It runs every CUDA op test against the CPU reference and the model tests (stories260K greedy
# text on the GPU equals the CPU's; audit --strict), measures the ceilings (device copy
# bandwidth, cuBLAS BF16 rate), times prefill and decode on synth models of the Llama-3-8B shape
# (8 of its 32 layers, BF16, Q8_0 and FP8 block-scaled), then MoE models (a Qwen3-30B-A3B shape and
# a DeepSeek-V2-Lite shape, a few layers each), serving runs with async scheduling on and off
# (stories260K, the Llama shape), and prints a short table last. Logs and JSON go to
# $OUT (summary.txt grows row by row, so a run cut short still reports what it did). Every step has
# its own time limit; a failing step is reported and the next runs.
# Parts: `bash bench/device_check.sh [all|core|moe|second]` — core: tests, stories260K, the Llama
# shapes; moe: the MoE shapes only (a second call, when the first ran out of time before them);
# second: the tests, the greedy text and logits on both devices, the Llama and MoE shapes with
# per-kernel profiles, no serving runs and no memcheck (a follow-up call with less time).
# Only 8 files come back from the device: every log goes into logs.tar.gz (rewritten after each
# step, so a run cut short still returns its logs) beside summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
B=$PWD/device-bundle
OUT=${OUT:-$PWD/device-out}
FINAL_OUT=$OUT
OUT=$PWD/device-logs  # the logs; packed into $FINAL_OUT/logs.tar.gz after every step
rm -rf "$OUT"
mkdir -p "$OUT" "$FINAL_OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
row() { printf '%-46s %s\n' "$1" "$2" >> "$SUMMARY"; }
pack() { tar -czf "$FINAL_OUT/logs.tar.gz" -C "$OUT" . 2>/dev/null; cp "$SUMMARY" "$FINAL_OUT/summary.txt"; }
step() { pack; echo "== [${SECONDS}s] $*"; }
trap pack EXIT
PART=${1:-all}
case $PART in all|core|moe|second) ;; *) echo "usage: $0 [all|core|moe|second]" >&2; exit 2 ;; esac
# second runs core's and moe's benchmarks without the serving runs, the wmma run and memcheck.
run_part() { [ "$PART" = all ] || [ "$PART" = "$1" ] || [ "$PART" = second ]; }
extras() { [ "$PART" = all ] || [ "$PART" = core ]; }

export FASTPATH_TESTDATA=$B/testdata
libs=$B/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libs=$libs:$d; done
# cuBLAS from the toolkit first, else from the image's Python packages; NCCL (opened at run time by
# the NCCL communicator) from those packages.
for pkg in cublas nccl; do
  pylib=$(python3 -c "import nvidia.$pkg, os; print(os.path.join(list(nvidia.$pkg.__path__)[0], 'lib'))" 2>/dev/null || true)
  [ -n "$pylib" ] && libs=$libs:$pylib
done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
FP=$B/bin/fastpath
TESTS=$B/bin/fastpath_tests
export FASTPATH_BIN=$FP  # the CLI tests' binary (not the build tree's path baked into them)
M=$B/testdata/models/stories260K/stories260K.gguf

step "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
row "bundle commit" "$(cat "$B/COMMIT" 2>/dev/null)"
row "gpu" "$(tail -n 1 "$OUT/gpu.txt")"
if ldd "$FP" | grep -q "not found"; then
  ldd "$FP" | tee "$OUT/ldd.txt"
  row "binaries" "MISSING LIBRARIES (see ldd.txt)"
  cat "$SUMMARY"
  exit 2
fi

SYN=$PWD/device-models
mkdir -p "$SYN"
spec_pair() {  # label, model path: one sequence's greedy decode without and with prompt-lookup drafts
  local label=$1 model=$2 k line
  step "speculative decoding $label"
  line=""
  for k in 0 4; do
    timeout 120 "$FP" generate --device cuda -m "$model" -p "Once upon a time there was" -n 128 --temp 0 --ignore-eos \
      --kv-cache-dtype bf16 --speculative-tokens $k > /dev/null 2> "$OUT/spec_${label}_$k.err"
    line="$line K=$k $(grep -o 'decode [0-9.]* tok/s' "$OUT/spec_${label}_$k.err" | head -1)"
  done
  row "$label generate 128, speculative" "$line; $(grep -o '[0-9.]* tokens per verification' "$OUT/spec_${label}_4.err" | head -1)"
}

bench_model() {  # label, model path, extra bench args...
  local label=$1 model=$2; shift 2
  step "bench $label"
  timeout 150 "$FP" bench -q --device cuda -m "$model" "$@" --json > "$OUT/bench_$label.json" 2> "$OUT/bench_$label.err"
  local rc=$?
  if [ $rc -ne 0 ]; then row "bench $label" "FAILED (exit $rc, bench_$label.err)"; tail -n 5 "$OUT/bench_$label.err"; return; fi
  python3 - "$OUT/bench_$label.json" "$label" >> "$SUMMARY" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); label = sys.argv[2]; c = j["ceiling"]
def f(k): return j.get(k, float("nan"))
print(f"{'ceilings':46s} copy {c['read_gbps']:.0f} GB/s, bf16 cuBLAS {c['fma_gflops']/1000:.0f} TFLOP/s")
g = j.get("device_gemm")
if g and g["bf16_gflops"] > 0:
    print(f"{'matmul op 8192^3 TFLOP/s':46s} bf16 {g['bf16_gflops']/1000:.0f}, fp8 block {g['fp8_block_gflops']/1000:.0f} "
          f"({g['fp8_block_gflops']/g['bf16_gflops']:.2f}x), fp8 dequantized {g['fp8_dequant_gflops']/1000:.0f}")
    if g.get("lt_fp8_candidates"):
        print(f"{'cuBLASLt fp8 matmul alone 8192^3 TFLOP/s':46s} heuristic's first {g['lt_fp8_first_gflops']/1000:.0f}, "
              f"fastest of {g['lt_fp8_candidates']} timed {g['lt_fp8_chosen_gflops']/1000:.0f}")
for r in j.get("device_gemv", []):  # bench --gemv-rates (the first BF16 run only)
    print(f"{'gemv alone BF16 ' + str(r['out']) + 'x' + str(r['in']) + ' GB/s':46s} gemv {r['gemv_gbps']:.0f}, "
          f"gemv_warp {r['gemv_warp_gbps']:.0f}; chained {r.get('gemv_chained_gbps', 0):.0f}, "
          f"{r.get('gemv_warp_chained_gbps', 0):.0f} (of copy {c['read_gbps']:.0f})")
if j.get("chained_launches"):
    print(f"{label + ' kernels chained':46s} yes (FASTPATH_CUDA_PDL=1)")
if "prefill_tps" in j:
    print(f"{label + ' prefill':46s} {f('prefill_tps'):.0f} tok/s = {100*f('prefill_ceiling_fraction'):.1f}% of the bf16 rate")
if "decode_tps" in j:
    print(f"{label + ' decode b=1':46s} {f('decode_tps'):.1f} tok/s = {100*f('decode_ceiling_fraction'):.1f}% of copy bandwidth ({f('decode_gbps'):.0f} GB/s)")
if "decode_overlapped_tps" in j:
    print(f"{label + ' decode b=1 overlapped':46s} {f('decode_overlapped_tps'):.1f} tok/s = {100*f('decode_overlapped_ceiling_fraction'):.1f}% of copy bandwidth")
for e in j.get("decode_batches", []):
    print(f"{label + ' decode b=' + str(e['batch']):46s} {e['decode_tps']:.1f} tok/s = {100*e['decode_ceiling_fraction']:.1f}% of its roofline")
PY
}

serve_pair() {  # label, model path, serving bench args...: async scheduling on vs off, alternated
  local label=$1 model=$2; shift 2
  for mode in on off on off; do
    step "serve $label async $mode"
    timeout 120 "$FP" bench -q --device cuda -m "$model" "$@" --async-scheduling $mode --json \
      >> "$OUT/serve_$label.jsonl" 2>> "$OUT/serve_$label.err" || { row "serve $label async $mode" "FAILED (serve_$label.err)"; return; }
  done
  python3 - "$OUT/serve_$label.jsonl" "$label" >> "$SUMMARY" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tps = {True: [], False: []}
for j in runs: tps[j["async_scheduling"]].append(j["runs"][0]["output_tps"])
on, off = sorted(tps[True]), sorted(tps[False])
fmt = lambda v: "/".join(f"{x:.0f}" for x in v)
print(f"{'serve ' + sys.argv[2] + ' output tok/s':46s} async on {fmt(on)}, off {fmt(off)}: {max(on) / max(off):.2f}x (best of 2)")
PY
}

if run_part core; then
step "CUDA op tests and model tests"
# Each test in its own process (as ctest runs them): a kernel that faults the CUDA context fails
# only its own test. No new test starts after 240 s.
: > "$OUT/tests.log"
ok=0; failed=0; skipped=0; failed_names=""
for t in $("$TESTS" --gtest_list_tests --gtest_filter='Cuda*:DevicePlacement*' | awk '/^[^ ]/ {s=$1} /^  / {print s $1}'); do
  if [ "$SECONDS" -gt 240 ]; then echo "time budget spent: $t not run" >> "$OUT/tests.log"; continue; fi
  timeout 120 "$TESTS" --gtest_filter="$t" > "$OUT/test_one.log" 2>&1
  rc=$?
  cat "$OUT/test_one.log" >> "$OUT/tests.log"
  if grep -q '^\[  SKIPPED \] 1 test' "$OUT/test_one.log"; then skipped=$((skipped + 1))
  elif [ $rc -eq 0 ]; then ok=$((ok + 1))
  else failed=$((failed + 1)); failed_names="$failed_names $t"; echo "FAILED (exit $rc): $t"; fi
done
row "CUDA tests" "$ok ok, $failed failed, $skipped skipped"
[ -n "$failed_names" ] && row "  failed" "$failed_names"

# The same kernels chained (programmatic dependent launch, pdl.cuh; off by default until timed
# here): the ops of a decode layer and the model tests, one process.
step "CUDA tests with chained launches"
FASTPATH_CUDA_PDL=1 timeout 150 "$TESTS" \
  --gtest_filter='CudaOps.MatMul*:CudaOps.RmsNorm*:CudaOps.Rope*:CudaOps.SiluMul*:CudaOps.KvWrite*:CudaOps.AddAndItsAliases:CudaOpsAttention.Decode*:CudaModel.*:DevicePlacement.DecodeStepsReplayRecordedGraphs' \
  > "$OUT/tests_chained.log" 2>&1
rc=$?
row "CUDA tests, chained launches" "exit $rc ($(grep -E -c '^\[       OK \]' "$OUT/tests_chained.log") ok, $(grep -E -c '^\[  FAILED  \] [A-Za-z]+\.' "$OUT/tests_chained.log") failed)"

step "stories260K greedy text, cpu vs cuda"
timeout 60 "$FP" generate -q -m "$M" -p "Once upon a time" -n 64 --device cpu > "$OUT/generate_cpu.txt" 2>&1
timeout 60 "$FP" generate -q -m "$M" -p "Once upon a time" -n 64 --device cuda > "$OUT/generate_cuda.txt" 2>&1
if cmp -s "$OUT/generate_cpu.txt" "$OUT/generate_cuda.txt"; then row "stories260K greedy 64 tokens" "same text on cuda and cpu"
else row "stories260K greedy 64 tokens" "DIFFERENT (generate_*.txt)"; fi
FASTPATH_CUDA_PDL=1 timeout 60 "$FP" generate -q -m "$M" -p "Once upon a time" -n 64 --device cuda > "$OUT/generate_cuda_chained.txt" 2>&1
if cmp -s "$OUT/generate_cpu.txt" "$OUT/generate_cuda_chained.txt"; then row "stories260K greedy 64 tokens, chained" "same text on cuda and cpu"
else row "stories260K greedy 64 tokens, chained" "DIFFERENT (generate_cuda_chained.txt)"; fi
# Speculative decoding (prompt-lookup drafts verified in one forward) on the device: the CPU's
# plain greedy text, through generate and through the engine.
timeout 60 "$FP" generate -q -m "$M" -p "Once upon a time" -n 64 --device cuda --speculative-tokens 4 --prompt-lookup-min 1 \
  > "$OUT/generate_cuda_spec.txt" 2> "$OUT/generate_cuda_spec.err"
if cmp -s "$OUT/generate_cpu.txt" "$OUT/generate_cuda_spec.txt"; then row "stories260K greedy 64 tokens, speculative" "same text on cuda and cpu"
else row "stories260K greedy 64 tokens, speculative" "DIFFERENT (generate_cuda_spec.*)"; fi
# The logits of a fixed token sequence on both devices, one batch and one token per step.
TOK="1 403 407 261 378 105 269 238 9 116 164 334 500 17 260 301 402 28 31 402"  # ids < 512 (its vocabulary)
for dev in cpu cuda; do
  timeout 60 "$FP" logits -q -m "$M" --device $dev --tokens "$TOK" --out "$OUT/logits_$dev.f32" > /dev/null 2>> "$OUT/logits.err"
  timeout 60 "$FP" logits -q -m "$M" --device $dev --tokens "$TOK" --incremental --out "$OUT/logits_inc_$dev.f32" > /dev/null 2>> "$OUT/logits.err"
done
python3 - "$OUT" >> "$SUMMARY" <<'PY' || row "logits cpu vs cuda" "FAILED (logits.err)"
import sys, numpy as np
o = sys.argv[1]
for kind in ("", "inc_"):
    a = np.fromfile(f"{o}/logits_{kind}cpu.f32", np.float32); b = np.fromfile(f"{o}/logits_{kind}cuda.f32", np.float32)
    rel = np.linalg.norm(a - b) / np.linalg.norm(a)
    n = 20; v = a.size // n
    agree = (a.reshape(n, v).argmax(1) == b.reshape(n, v).argmax(1)).sum()
    print(f"{'logits cpu vs cuda ' + (kind or 'batch_'):46s} rel err {rel:.2e}, argmax agrees {agree}/{n}")
PY

# The engine's overlap: each step scheduled and launched while the one before runs (stories260K:
# tiny steps, where the host's share is largest; then the Llama shape below).
extras && serve_pair stories "$M" --requests 128 --input-len 32 --output-len 96 --concurrency 32 --max-model-len 256

step "audit --strict --device cuda"
timeout 60 "$FP" audit --strict --profile --device cuda -m "$M" > "$OUT/audit_stories.txt" 2>&1
row "audit --strict (stories260K)" "exit $? ($(grep -c ' cuda ' "$OUT/audit_stories.txt") cuda rows)"

# Llama-3-8B shape, 8 of its 32 layers (per-layer work is identical; the roofline fractions hold).
CFG='{"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":8,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":8192,"rope_theta":500000.0,"rms_norm_eps":1e-5,"tie_word_embeddings":false}'
for T in bf16 q8_0; do
  step "synth llama-8B-shape $T"
  timeout 150 "$FP" synth --arch llama --fast-fill --config "$CFG" --type $T --out "$SYN/llama8b-8l-$T.gguf" > "$OUT/synth_$T.log" 2>&1 \
    || row "synth $T" "FAILED (synth_$T.log)"
  # (BF16 only: the decode GEMVs alone too, ~10 s, once.)
  [ -f "$SYN/llama8b-8l-$T.gguf" ] && bench_model "8b8l-$T" "$SYN/llama8b-8l-$T.gguf" -p 4096 -n 64 -b 8,16,64 -r 3 --warmup 1 \
    --kv-cache-dtype bf16 $([ "$T" = bf16 ] && echo --gemv-rates)
  # The warp-per-rows GEMV against the default block GEMV (below it until timed here): decode
  # at batch 1 and 8 (the GEMV's range), every matmul forced onto it; then both with the
  # decode kernels chained (FASTPATH_CUDA_PDL=1).
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-gemv_warp" "$SYN/llama8b-8l-$T.gguf" -p 0 -n 64 -b 8 -r 3 --warmup 1 --kv-cache-dtype bf16 --kernel matmul=gemv_warp
  # Q8_0 rows read in whole 16-byte loads (gemv_q8, below gemv until timed here) against the
  # default GEMV's 2-byte loads: decode at batch 1 and 8.
  [ "$T" = q8_0 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-gemv_q8" "$SYN/llama8b-8l-$T.gguf" -p 0 -n 64 -b 8 -r 3 --warmup 1 --kv-cache-dtype bf16 --kernel matmul=gemv_q8
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && FASTPATH_CUDA_PDL=1 \
    bench_model "8b8l-$T-chained" "$SYN/llama8b-8l-$T.gguf" -p 0 -n 64 -b 8,64 -r 3 --warmup 1 --kv-cache-dtype bf16
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && FASTPATH_CUDA_PDL=1 \
    bench_model "8b8l-$T-chained-gemv_warp" "$SYN/llama8b-8l-$T.gguf" -p 0 -n 64 -b 8 -r 3 --warmup 1 --kv-cache-dtype bf16 --kernel matmul=gemv_warp
  # Decode with every step eager, for the CUDA-graph comparison (issue 8: batch 64 with and without).
  # Where the time goes: every kernel call timed (synchronised), prefill of 4096 and 32 decode steps.
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-profile" "$SYN/llama8b-8l-$T.gguf" -p 4096 -n 32 -r 1 --warmup 1 --kv-cache-dtype bf16 --profile
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-nographs" "$SYN/llama8b-8l-$T.gguf" -p 0 -n 64 -b 64 -r 3 --warmup 1 --kv-cache-dtype bf16 --no-cuda-graphs
  # Speculative decoding: what a check of 5 tokens costs against a step on the GPU (the model's
  # greedy output loops, so every draft holds: an upper bound on the gain).
  extras && [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && spec_pair "8b8l-$T" "$SYN/llama8b-8l-$T.gguf"
  extras && [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    serve_pair "8b8l-$T" "$SYN/llama8b-8l-$T.gguf" --requests 64 --input-len 128 --output-len 64 --concurrency 32 \
      --max-model-len 512 --kv-cache-dtype bf16
  # Prefill attention on the tensor cores (kernel wmma, below `tiled` until checked here).
  # The register-resident flash attention (kernel mma, below `tiled` until checked here).
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-mma" "$SYN/llama8b-8l-$T.gguf" -p 4096 -n 8 -r 3 --warmup 1 --kv-cache-dtype bf16 --kernel attention=mma
  # The same loop on BF16 operands with cp.async double-buffered tiles (kernel mma_pipelined).
  [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-mma_pipelined" "$SYN/llama8b-8l-$T.gguf" -p 4096 -n 8 -r 3 --warmup 1 --kv-cache-dtype bf16 --kernel attention=mma_pipelined
  extras && [ "$T" = bf16 ] && [ -f "$SYN/llama8b-8l-$T.gguf" ] && \
    bench_model "8b8l-$T-wmma" "$SYN/llama8b-8l-$T.gguf" -p 4096 -n 8 -r 2 --warmup 1 --kv-cache-dtype bf16 --kernel attention=wmma
  rm -f "$SYN/llama8b-8l-$T.gguf"
done
step "synth llama-8B-shape fp8 (safetensors, 128x128 block scales)"
timeout 150 "$FP" synth --arch llama --fast-fill --config "$CFG" --type fp8 --out "$SYN/llama8b-8l-fp8" > "$OUT/synth_fp8.log" 2>&1 \
  || row "synth fp8" "FAILED (synth_fp8.log)"
[ -d "$SYN/llama8b-8l-fp8" ] && bench_model "8b8l-fp8" "$SYN/llama8b-8l-fp8" -p 4096 -n 64 -b 8 -r 3 --warmup 1 --kv-cache-dtype bf16
[ -d "$SYN/llama8b-8l-fp8" ] && \
  bench_model "8b8l-fp8-gemv_warp" "$SYN/llama8b-8l-fp8" -p 0 -n 64 -b 8 -r 3 --warmup 1 --kv-cache-dtype bf16 --kernel matmul=gemv_warp
[ -d "$SYN/llama8b-8l-fp8" ] && \
  bench_model "8b8l-fp8-profile" "$SYN/llama8b-8l-fp8" -p 4096 -n 32 -r 1 --warmup 1 --kv-cache-dtype bf16 --profile
rm -rf "$SYN/llama8b-8l-fp8"
fi  # core

if run_part moe; then
# Qwen3-30B-A3B shape (128 experts, top 8, GQA 32/4 heads of 128), 2 of its 48 layers, Q8_0:
# the grouped expert kernels (moe_route, moe_ffn) at decode and prefill sizes.
QCFG='{"hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":2,"num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"vocab_size":151936,"max_position_embeddings":8192,"rope_theta":1000000.0,"rms_norm_eps":1e-6,"num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"tie_word_embeddings":false}'
step "synth qwen3moe (30B-A3B shape, 2 layers) q8_0"
timeout 120 "$FP" synth --arch qwen3_moe --fast-fill --config "$QCFG" --type q8_0 --out "$SYN/q3moe-2l-q8_0.gguf" > "$OUT/synth_q3moe.log" 2>&1 \
  || row "synth qwen3moe" "FAILED (synth_q3moe.log)"
[ -f "$SYN/q3moe-2l-q8_0.gguf" ] && bench_model "q3moe2l-q8_0" "$SYN/q3moe-2l-q8_0.gguf" -p 1024 -n 32 -b 16 -r 2 --warmup 1 --kv-cache-dtype bf16
rm -f "$SYN/q3moe-2l-q8_0.gguf"
# DeepSeek-V2-Lite shape (MLA: 16 heads, kv_lora 512; 64 experts top 6, 2 shared; the first layer
# dense), 3 of its 27 layers, Q8_0: the MLA kernel and the grouped experts with a shared expert.
DCFG='{"hidden_size":2048,"intermediate_size":10944,"num_hidden_layers":3,"num_attention_heads":16,"vocab_size":102400,"max_position_embeddings":8192,"rope_theta":10000.0,"rms_norm_eps":1e-6,"kv_lora_rank":512,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,"n_routed_experts":64,"num_experts_per_tok":6,"moe_intermediate_size":1408,"n_shared_experts":2,"first_k_dense_replace":1,"tie_word_embeddings":false}'
step "synth deepseek (V2-Lite shape, 3 layers) q8_0"
timeout 120 "$FP" synth --arch deepseek_v2 --fast-fill --config "$DCFG" --type q8_0 --out "$SYN/v2lite-3l-q8_0.gguf" > "$OUT/synth_v2lite.log" 2>&1 \
  || row "synth deepseek" "FAILED (synth_v2lite.log)"
[ -f "$SYN/v2lite-3l-q8_0.gguf" ] && bench_model "v2lite3l-q8_0" "$SYN/v2lite-3l-q8_0.gguf" -p 1024 -n 32 -b 16 -r 2 --warmup 1 --kv-cache-dtype bf16
fi  # moe
rm -rf "$SYN"

# Memory checking, time permitting: the kernels with the most indexing (attention, MLA, the MoE
# grouping, sampling, the KV writes) under compute-sanitizer's memcheck.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if extras && [ -n "$SAN" ] && [ "$SECONDS" -lt 420 ]; then
  step "compute-sanitizer memcheck"
  timeout 100 "$SAN" --tool memcheck --error-exitcode 3 "$TESTS" \
    --gtest_filter='CudaOpsAttention.*:CudaOps.MlaAttention*:CudaOps.MoeRoute*:CudaOps.MoeFfn*:CudaOps.Sample*:CudaOps.KvWrite*' \
    > "$OUT/memcheck.log" 2>&1
  rc=$?
  row "compute-sanitizer memcheck (attention, MLA, MoE, sampling, KV)" "exit $rc ($(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/memcheck.log") clean summaries; $(grep -E -c '^\[       OK \]' "$OUT/memcheck.log") tests ok)"
fi

echo
echo "==== device check summary (${SECONDS}s) ===="
cat "$SUMMARY"
