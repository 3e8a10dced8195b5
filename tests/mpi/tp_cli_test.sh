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
gen=(generate -m "$model" -p "Once upon a time" -n 48 --temp 0 -t 1)

one=$("$bin" "${gen[@]}" -q)
two=$(run2 2 "$bin" "${gen[@]}" --tensor-parallel-size 2 -q)
[ -n "$one" ] && [ "$one" = "$two" ]; check "greedy text with TP=2 equals TP=1" $?
[ "$(printf '%s\n' "$two" | wc -l)" = "$(printf '%s\n' "$one" | wc -l)" ]; check "only rank 0 prints" $?

toks="1 403 407 261 378 1 22 33"
"$bin" logits -m "$model" --tokens "$toks" --out "$tmp/one.f32" -q -t 1
run2 2 "$bin" logits -m "$model" --tokens "$toks" --out "$tmp/two.f32" -q -t 1 --tensor-parallel-size 2
python3 - "$tmp/one.f32" "$tmp/two.f32" <<'PY'
import array, sys
a, b = (array.array('f', open(p, 'rb').read()) for p in sys.argv[1:3])
assert len(a) == len(b) == 8 * 512, (len(a), len(b))
err = max(abs(x - y) for x, y in zip(a, b)); top = max(abs(x) for x in a)
print(f"logits: max abs diff {err:.3g}, relative {err / top:.3g}")
sys.exit(0 if err / top < 1e-4 else 1)
PY
check "logits with TP=2 within 1e-4 of TP=1" $?

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
err=$(run2 2 "$bin" generate -m "$model" --batch-file /dev/null --tensor-parallel-size 2 2>&1); rc=$?
[ $rc != 0 ] && grep -q "does not run tensor parallel yet" <<<"$err"; check "batch-file with TP is refused" $?

exit $failures
