#!/usr/bin/env bash
# tests/mpi/tp_cli_test.sh FASTPATH MPIEXEC SOURCE_DIR — the command line of tensor parallel:
# `mpirun -np 2 fastpath generate --tensor-parallel-size 2` prints the greedy text of one rank
# (rank 0 alone writes), `logits` agrees, `audit` shows the MPI all-reduce, and sizes that do not
# match the launch or the model fail with both numbers in the message. Exit 77: test data missing.
set -uo pipefail
bin=$1; mpiexec=$2; src=$3
td=${FASTPATH_TESTDATA:-$src/../shared/testdata}
model=$td/models/stories260K/stories260K.gguf
[ -f "$model" ] || { echo "skip: test data missing: $model"; exit 77; }
run2() { "$mpiexec" --oversubscribe -np "$1" "${@:2}"; }
failures=0
check() {  # check NAME CONDITION-RESULT
  if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
same_logits() {  # same_logits A.f32 B.f32 COUNT: both hold COUNT floats, within 1e-4 of the largest
  python3 - "$@" <<'PY'
import array, sys
a, b = (array.array('f', open(p, 'rb').read()) for p in sys.argv[1:3])
assert len(a) == len(b) == int(sys.argv[3]), (len(a), len(b))
err = max(abs(x - y) for x, y in zip(a, b)); top = max(abs(x) for x in a)
print(f"logits: max abs diff {err:.3g}, relative {err / top:.3g}")
sys.exit(0 if err / top < 1e-4 else 1)
PY
}
gen=(generate -m "$model" -p "Once upon a time" -n 48 --temp 0 -t 1)

one=$("$bin" "${gen[@]}" -q)
two=$(run2 2 "$bin" "${gen[@]}" --tensor-parallel-size 2 -q)
[ -n "$one" ] && [ "$one" = "$two" ]; check "greedy text with TP=2 equals TP=1" $?
[ "$(printf '%s\n' "$two" | wc -l)" = "$(printf '%s\n' "$one" | wc -l)" ]; check "only rank 0 prints" $?

toks="1 403 407 261 378 1 22 33"
"$bin" logits -m "$model" --tokens "$toks" --out "$tmp/one.f32" -q -t 1
run2 2 "$bin" logits -m "$model" --tokens "$toks" --out "$tmp/two.f32" -q -t 1 --tensor-parallel-size 2
same_logits "$tmp/one.f32" "$tmp/two.f32" $((8 * 512))
check "logits with TP=2 within 1e-4 of TP=1" $?

ovl=$(run2 2 "$bin" "${gen[@]}" --tensor-parallel-size 2 --micro-batch-overlap 2 -q)
[ -n "$one" ] && [ "$one" = "$ovl" ]; check "greedy text with TP=2 and --micro-batch-overlap 2 equals TP=1" $?
audit=$(run2 2 "$bin" audit -m "$model" -p 8 -n 2 -t 1 --tensor-parallel-size 2 --micro-batch-overlap 4)
grep -Eq '^all_reduce_start +f32 sum comm=mpi ranks=2 +mpi ' <<<"$audit" && grep -Eq '^collective_wait +started comm=mpi' <<<"$audit"
check "audit of an overlapped prefill shows the started all-reduces and their waits" $?

audit=$(run2 2 "$bin" audit -m "$model" -p 8 -n 2 -t 1 --tensor-parallel-size 2)
grep -Eq '^all_reduce +f32 sum comm=mpi ranks=2 +mpi ' <<<"$audit"; check "audit shows the mpi all_reduce" $?
grep -q 'refused single: the communicator is mpi, not single' <<<"$audit"; check "audit shows why single was refused" $?

err=$(run2 2 "$bin" "${gen[@]}" --tensor-parallel-size 3 2>&1); rc=$?
[ $rc != 0 ] && grep -q "tensor-parallel-size 3 but the MPI world has 2 rank" <<<"$err"; check "TP 3 on 2 ranks is refused" $?
err=$("$bin" "${gen[@]}" --tensor-parallel-size 2 2>&1); rc=$?
[ $rc != 0 ] && grep -q "tensor-parallel-size 2 but the MPI world has 1 rank" <<<"$err"; check "TP 2 without mpirun is refused" $?
err=$(run2 2 "$bin" "${gen[@]}" 2>&1); rc=$?
[ $rc != 0 ] && grep -q "one of 2 ranks" <<<"$err"; check "2 ranks with TP 1 are refused" $?
err=$(run2 3 "$bin" "${gen[@]}" --tensor-parallel-size 3 2>&1); rc=$?
[ $rc != 0 ] && grep -q "must divide the attention heads (8) and the KV heads (4)" <<<"$err"; check "3 ranks cannot split 8 heads" $?

# Prefill context parallel + tensor-parallel decode: one layout per phase on the same 2 ranks.
two=$(run2 2 "$bin" "${gen[@]}" --prefill-context-parallel-size 2 --tensor-parallel-size 2 -q)
one=$("$bin" "${gen[@]}" -q)
[ -n "$one" ] && [ "$one" = "$two" ]; check "greedy text with prefill CP=2 + decode TP=2 equals one rank" $?
audit=$(run2 2 "$bin" audit -m "$model" -p 8 -n 2 -t 1 --pcp 2 --tp 2)
grep -Eq '^all_gather ' <<<"$audit" && grep -Eq '^all_reduce ' <<<"$audit"; check "audit shows CP's all_gather and TP's all_reduce" $?

# The engine across ranks: rank 0 schedules, the others follow each step. A batch file gives the
# one-rank results; `serve` under mpirun answers a completion with the one-rank greedy text and
# shuts down cleanly on SIGTERM (the followers are released).
printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 30}' '{"prompt": "The little dog", "max_tokens": 20}' \
  '{"prompt": "Lily", "max_tokens": 25}' > "$tmp/batch.jsonl"
one=$("$bin" generate -m "$model" --batch-file "$tmp/batch.jsonl" --temp 0 -t 1 -q --kv-cache-memory 64MiB)
two=$(run2 2 "$bin" generate -m "$model" --batch-file "$tmp/batch.jsonl" --temp 0 -t 1 -q --kv-cache-memory 64MiB --tp 2)
[ -n "$one" ] && [ "$one" = "$two" ]; check "batch file with TP=2 equals one rank" $?
spec=$(run2 2 "$bin" generate -m "$model" --batch-file "$tmp/batch.jsonl" --temp 0 -t 1 -q --kv-cache-memory 64MiB --tp 2 \
  --speculative-tokens 4 --prompt-lookup-min 1)
[ -n "$one" ] && [ "$one" = "$spec" ]; check "batch file with TP=2 and speculative decoding equals one rank" $?
spec=$(run2 2 "$bin" "${gen[@]}" --tensor-parallel-size 2 --speculative-tokens 4 --prompt-lookup-min 1 -q)
[ -n "$spec" ] && [ "$spec" = "$("$bin" "${gen[@]}" -q)" ]; check "greedy text with TP=2 and speculative decoding equals TP=1" $?
# Sampled, no seed given: each rank draws its own seed, so only rank 0's verdict on each draft
# may count (broadcast); its text equals one rank's run from the seed rank 0 logged.
spec=$(run2 2 "$bin" generate -m "$model" -p "Once upon a time" -n 64 --temp 0.8 -t 1 --tensor-parallel-size 2 \
  --speculative-tokens 4 --prompt-lookup-min 1 2> "$tmp/spec.err")
seed=$(grep -o 'seed [0-9]*' "$tmp/spec.err" | head -1 | cut -d' ' -f2)
[ -n "$seed" ] && [ -n "$spec" ] && \
  [ "$spec" = "$("$bin" generate -m "$model" -p "Once upon a time" -n 64 --temp 0.8 -t 1 -s "$seed" -q)" ]
check "sampled text with TP=2 and speculative decoding equals one rank from rank 0's seed" $?

# Drafts from the model's own multi-token-prediction layer across ranks (every rank runs the same
# draft steps): GLM-4.5's shape split by heads (TP) or experts (EP), DeepSeek-V3's by experts;
# one-sequence generate and the engine each give one rank's plain greedy text.
glm='{"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
  "num_hidden_layers": 2, "vocab_size": 512, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "n_shared_experts": 1, "first_k_dense_replace": 1, "attention_bias": true, "partial_rotary_factor": 0.5,
  "num_nextn_predict_layers": 1}'
ds='{"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "n_shared_experts": 1,
  "first_k_dense_replace": 1, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
  "v_head_dim": 32, "num_nextn_predict_layers": 1}'
"$bin" synth --arch glm4_moe --config "$glm" --out "$tmp/glm_mtp.gguf" 2>/dev/null
"$bin" synth --arch deepseek_v3 --config "$ds" --out "$tmp/ds_mtp.gguf" 2>/dev/null
for case in "glm_mtp --tp 2" "glm_mtp --ep 2" "ds_mtp --ep 2"; do
  read -r name flag size <<<"$case"
  m=(-m "$tmp/$name.gguf" -t 1 -q --temp 0)
  plain=$("$bin" generate "${m[@]}" -p "Once upon a time" -n 40 --ignore-eos)
  drafted=$(run2 2 "$bin" generate "${m[@]}" -p "Once upon a time" -n 40 --ignore-eos "$flag" "$size" --speculative-method mtp \
    --speculative-tokens 2)
  [ -n "$plain" ] && [ "$plain" = "$drafted" ]; check "$name: greedy text with $flag $size and MTP drafts equals one rank's plain text" $?
  plain=$("$bin" generate "${m[@]}" --batch-file "$tmp/batch.jsonl" --kv-cache-memory 64MiB --ignore-eos)
  drafted=$(run2 2 "$bin" generate "${m[@]}" --batch-file "$tmp/batch.jsonl" --kv-cache-memory 64MiB --ignore-eos "$flag" "$size" \
    --speculative-method mtp --speculative-tokens 2)
  [ -n "$plain" ] && [ "$plain" = "$drafted" ]; check "$name: batch file with $flag $size and MTP drafts equals one rank's plain results" $?
done
asy=$("$bin" generate -m "$model" --batch-file "$tmp/batch.jsonl" --temp 0 -t 1 -q --kv-cache-memory 64MiB --async-scheduling on)
[ -n "$one" ] && [ "$one" = "$asy" ]; check "batch file with async scheduling forced on equals step by step" $?
err=$(run2 2 "$bin" generate -m "$model" --batch-file "$tmp/batch.jsonl" --temp 0 -t 1 -q --kv-cache-memory 64MiB --tp 2 \
  --async-scheduling on 2>&1); rc=$?
[ $rc != 0 ] && grep -q "async-scheduling on: a model split across ranks" <<<"$err"; check "async scheduling across ranks is refused with the reason" $?
want=$("$bin" generate -m "$model" -p "Once upon a time" -n 24 --temp 0 -t 1 -q --ignore-eos)
"$mpiexec" --oversubscribe -np 2 "$bin" serve -m "$model" --tp 2 -t 1 --port 0 --port-file "$tmp/port" \
  --kv-cache-memory 64MiB 2>"$tmp/serve.log" &
srv=$!  # mpirun itself: it forwards SIGTERM to the ranks
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
got=$(python3 - "$(cat "$tmp/port" 2>/dev/null)" <<'PY'
import json, sys, urllib.request
body = json.dumps({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": True}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", body, {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"])
PY
)
[ -n "$got" ] && [ "$got" = "$want" ]; check "serve under mpirun -np 2 --tp 2 answers with the one-rank text" $?
# mpirun forwards SIGTERM to the ranks (its own exit status then reports the signal): rank 0
# finishes and releases the follower, and both ranks exit.
kill -TERM $srv; wait $srv
grep -q "server stopped" "$tmp/serve.log" && ! pgrep -f "port-file $tmp/port" >/dev/null
check "serve under mpirun stops cleanly on SIGTERM" $?

# Expert parallel from the command line: a small DeepSeek-V3-shaped model (MLA replicated,
# experts partitioned; synth models carry no tokenizer, so token ids) gives the one-rank logits;
# audit names each rank's expert range.
ds=$tmp/ds.gguf
"$bin" synth --arch deepseek_v3 --type q8_0 --out "$ds" --config '{"hidden_size": 64, "num_attention_heads": 2,
  "intermediate_size": 96, "num_hidden_layers": 3, "vocab_size": 256, "n_routed_experts": 6, "num_experts_per_tok": 2,
  "moe_intermediate_size": 96, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32,
  "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}' >/dev/null
ds_toks="1 9 200 33 71 4 150 88"
"$bin" logits -m "$ds" --tokens "$ds_toks" --out "$tmp/ds1.f32" -q -t 1
run2 2 "$bin" logits -m "$ds" --tokens "$ds_toks" --out "$tmp/ds2.f32" -q -t 1 --expert-parallel-size 2
same_logits "$tmp/ds1.f32" "$tmp/ds2.f32" $((8 * 256))
check "logits with EP=2 within 1e-4 of one rank" $?
audit=$(run2 2 "$bin" audit -m "$ds" -p 8 -n 2 -t 1 --ep 2)
grep -q 'expert parallel 2' <<<"$audit" && grep -Eq '^moe_ffn .*experts 0\.\.2 of 6' <<<"$audit"; check "audit shows rank 0's experts 0..2" $?
run2 2 "$bin" logits -m "$ds" --tokens "$ds_toks" --out "$tmp/ds5.f32" -q -t 1 --ep 2 --data-parallel-attention
same_logits "$tmp/ds1.f32" "$tmp/ds5.f32" $((8 * 256))
check "logits with EP=2 and data-parallel attention within 1e-4 of one rank" $?
# Serving with data-parallel attention: each rank stores its partition of the KV pool (7 blocks
# of 16 tokens in 64 KiB at 576 B/token in F32), the two ranks hold 14, and every request completes;
# prompts sharing 32 tokens hit the prefix cache of the rank that computed them.
out=$(run2 2 "$bin" bench -m "$ds" --requests 8 --input-len 40 --shared-prefix-len 32 --output-len 8 --concurrency 4 -t 1 \
  --ep 2 --data-parallel-attention --kv-cache-memory 64KiB --max-model-len 64 --kv-cache-dtype f32 --json 2>&1)
grep -q '7 blocks of 16 tokens (112 tokens, 576 B/token) per rank; data-parallel attention: 2 ranks hold 14 blocks' <<<"$out" &&
  grep -q '"requests": *8' <<<"$out" && grep -q '"prefix_caching": *true' <<<"$out" &&
  grep -oE '"prefix_hit_rate": *[0-9.e+-]+' <<<"$out" | grep -qvE ': *0(\.0*)?$'
check "bench with data-parallel attention: a KV partition per rank, prefix-cache hits, 8 requests served" $?
err=$(run2 2 "$bin" logits -m "$ds" --tokens "$ds_toks" --out "$tmp/x.f32" -t 1 --tensor-parallel-size 2 2>&1); rc=$?
[ $rc != 0 ] && grep -q "by experts only" <<<"$err"; check "TP on MLA is refused with the reason" $?
# Prefill context parallel, decode expert parallel: the prompt's logits (a CP step) give the
# one-rank logits. F32 weights: with Q8_0, each rank's run of 4 tokens takes the GEMV kernels
# where one rank's 8 take the GEMM ones, whose activation rounding differs (~1% here).
dsf=$tmp/dsf.gguf
"$bin" synth --arch deepseek_v3 --type f32 --out "$dsf" --config '{"hidden_size": 64, "num_attention_heads": 2,
  "intermediate_size": 96, "num_hidden_layers": 3, "vocab_size": 256, "n_routed_experts": 6, "num_experts_per_tok": 2,
  "moe_intermediate_size": 96, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32,
  "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}' >/dev/null
"$bin" logits -m "$dsf" --tokens "$ds_toks" --out "$tmp/dsf1.f32" -q -t 1
run2 2 "$bin" logits -m "$dsf" --tokens "$ds_toks" --out "$tmp/dsf2.f32" -q -t 1 --pcp 2 --ep 2
same_logits "$tmp/dsf1.f32" "$tmp/dsf2.f32" $((8 * 256))
check "logits of a prefill CP=2 step (decode layout EP=2) within 1e-4 of one rank" $?
run2 2 "$bin" logits -m "$dsf" --tokens "$ds_toks" --out "$tmp/dsf3.f32" -q -t 1 --ep 2 --data-parallel-attention \
  --micro-batch-overlap 2
same_logits "$tmp/dsf1.f32" "$tmp/dsf3.f32" $((8 * 256))
check "logits with EP=2, data-parallel attention and --micro-batch-overlap 2 within 1e-4 of one rank" $?
err=$("$bin" logits -m "$ds" --tokens "$ds_toks" --out "$tmp/x.f32" -t 1 --data-parallel-attention 2>&1); rc=$?
[ $rc != 0 ] && grep -q "given without it" <<<"$err"; check "--data-parallel-attention without --ep is refused" $?
err=$("$bin" logits -m "$ds" --tokens "$ds_toks" --out "$tmp/x.f32" -t 1 --expert-parallel-size 2 2>&1); rc=$?
[ $rc != 0 ] && grep -q "expert-parallel-size 2 but the MPI world has 1 rank" <<<"$err"; check "EP 2 without mpirun is refused" $?

# --parallel-plan: the planner picks the sizes for this machine (the shipped CPU file): the text is
# one rank's, the choice and its reason are logged, and explicit sizes beside it are refused.
one=$("$bin" "${gen[@]}" -q)
err=$(run2 2 "$bin" "${gen[@]}" --parallel-plan "$src/hardware/cpu-2rank-this-vm.json" 2>&1 >"$tmp/plan.txt")
[ -n "$one" ] && [ "$one" = "$(cat "$tmp/plan.txt")" ] && grep -q "parallel plan for 2 rank(s) of this VM" <<<"$err" &&
  grep -qE "decode TP2, prefill (TP2|CP2) \(--tp 2( --pcp 2)?\)" <<<"$err" && grep -q "decode candidates:" <<<"$err"
check "generate --parallel-plan: the planner's layout, one rank's text" $?
err=$(run2 2 "$bin" "${gen[@]}" --parallel-plan "$src/hardware/cpu-2rank-this-vm.json" --tp 2 2>&1); rc=$?
[ $rc != 0 ] && grep -q "parallel-plan chooses the parallel sizes itself" <<<"$err"
check "--parallel-plan with --tp is refused" $?

# bench-comm across 2 ranks: both ops at both sizes, bus bandwidth over a link, and the
# interconnect figures a hardware file takes.
out=$(run2 2 "$bin" bench-comm -q --json --sizes 4,64K --iters 3)
python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
r = j["results"]
assert j["ranks"] == 2 and j["backend"] == "mpi", j
assert [(x["op"], x["bytes"]) for x in r] == [("all_reduce", 4), ("all_reduce", 65536), ("all_gather", 4), ("all_gather", 65536)], r
assert all(x["seconds"] > 0 and x["busbw_gbps"] > 0 for x in r), r
assert abs(r[1]["busbw_gbps"] - r[1]["algbw_gbps"]) < 1e-9 * r[1]["algbw_gbps"], "2 ranks: all-reduce busbw = algbw"
assert j["interconnect"]["bandwidth_gbps"] > 0 and j["interconnect"]["latency_us"] > 0, j
PY
check "bench-comm over 2 ranks: all-reduce and all-gather bandwidths and the link figures" $?

# Ranks bound to a core each (mpirun's default for -np 2, forced here): two threads per rank are
# said to take turns on one CPU, and bench measures the ceiling on both ranks' CPUs, not on
# rank 0's core alone.
# (A core may hold several hardware threads: the CPUs a bound rank sees are counted first.)
core=$("$mpiexec" --oversubscribe --bind-to core -np 1 nproc)
err=$("$mpiexec" --oversubscribe --bind-to core -np 2 "$bin" generate -m "$model" -p "Once" -n 4 --temp 0 -t $((core + 1)) \
  --tp 2 2>&1 >/dev/null)
grep -q "$((core + 1)) threads on $core CPU(s) (" <<<"$err" && grep -q "mpirun --bind-to none" <<<"$err"
check "a rank bound to one core ($core CPU(s)) with -t $((core + 1)) is told its threads take turns" $?
out=$("$mpiexec" --oversubscribe --bind-to core -np 2 "$bin" bench -q --json -m "$model" -p 8 -n 4 -t 1 --tp 2 -r 1)
grep -qE "\"cpus\": *$((2 * core))[,}]" <<<"$out"
check "bench under per-core binding measures the ceiling on both ranks' CPUs" $?

exit $failures
