#!/usr/bin/env bash
# tests/mpi/two_hosts_test.sh FASTPATH MPI_TESTS MPIEXEC SOURCE_DIR — ranks on two hosts: two
# network namespaces joined by a veth pair stand in for two machines on a network, each with its
# own IP address and its own OpenMPI daemon (started through an rsh agent that enters the
# namespace, as ssh would log in), ranks talking over TCP only (`--mca btl tcp,self`: no shared
# memory between them). Runs the collective tests and a tensor-parallel / context-parallel
# subset of the MPI model tests across the hosts, then the command line: `generate` under TP=2
# and under CP prefill + TP decode prints one rank's text. Exit 77 (skipped, with the reason)
# where namespaces cannot be made (not root, no iproute2, no CAP_NET_ADMIN) or test data is missing.
set -uo pipefail
bin=$1; mpi_tests=$2; mpiexec=$3; src=$4
td=$(realpath -m "${FASTPATH_TESTDATA:-$src/../shared/testdata}")
model=$td/models/stories260K/stories260K.gguf
[ -f "$model" ] || { echo "skip: test data missing: $model"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "skip: network namespaces need root"; exit 77; }
command -v ip > /dev/null || { echo "skip: iproute2's ip is not installed"; exit 77; }

tag=fp$$; subnet=10.$((60 + $$ % 100)).$(($$ / 100 % 250))
ns_a=${tag}a; ns_b=${tag}b; host_a=$subnet.1; host_b=$subnet.2
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$ns_a" 2> /dev/null; ip netns del "$ns_b" 2> /dev/null  # deleting a namespace deletes its veth end
  rm -rf "$tmp"
}
trap cleanup EXIT
if ! { ip netns add "$ns_a" && ip netns add "$ns_b" && ip link add "${tag}va" type veth peer name "${tag}vb" &&
       ip link set "${tag}va" netns "$ns_a" && ip link set "${tag}vb" netns "$ns_b" &&
       ip -n "$ns_a" addr add "$host_a/24" dev "${tag}va" && ip -n "$ns_b" addr add "$host_b/24" dev "${tag}vb" &&
       ip -n "$ns_a" link set "${tag}va" up && ip -n "$ns_b" link set "${tag}vb" up &&
       ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up; } 2> "$tmp/ip.err"; then
  ip link del "${tag}va" 2> /dev/null  # the veth pair, if it was made but not moved
  echo "skip: cannot make two network namespaces here: $(head -c 300 "$tmp/ip.err")"; exit 77
fi
# The rsh agent OpenMPI calls as `agent HOST COMMAND...` to start its daemon on HOST.
cat > "$tmp/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in $host_a) ns=$ns_a ;; $host_b) ns=$ns_b ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$tmp/agent.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 FASTPATH_TESTDATA=$td ASAN_OPTIONS=${ASAN_OPTIONS:-}
# mpirun runs on host A and starts one rank there and one on host B. --bind-to none: each host's
# daemon would pin its rank to "its" core 0, the same core of this one machine.
two_hosts() {
  timeout 60 ip netns exec "$ns_a" "$mpiexec" --host "$host_a,$host_b" -np 2 --mca plm_rsh_agent "$tmp/agent.sh" \
    --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    -x FASTPATH_TESTDATA -x ASAN_OPTIONS "$@"
}
failures=0
check() {  # check NAME STATUS
  if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

where=$(two_hosts sh -c 'ip -4 -o addr show scope global | grep -o "inet [0-9.]*" | cut -d" " -f2' 2>/dev/null | sort | tr '\n' ' ')
[ "$where" = "$host_a $host_b " ]; check "one rank on each host (addresses seen by the ranks: $where)" $?

filter='Kernels/Collectives.*:CollectivesLedger.*:TensorParallel.Stories260KMatchesOneRank'
filter+=':Layouts/ContextParallel.*stories*:Layouts/EngineAcrossRanks.*'
two_hosts "$mpi_tests" --gtest_color=no --gtest_filter="$filter" > "$tmp/gtest.log" 2>&1
rc=$?; grep -E '^\S*\[  (PASSED|FAILED)' "$tmp/gtest.log" | head -5
[ $rc = 0 ] && grep -qE '^\[  PASSED  \] [1-9][0-9]* tests?\.' "$tmp/gtest.log"; check "collectives, TP, CP and the engine across ranks, over TCP between hosts" $?
[ $rc = 0 ] || tail -40 "$tmp/gtest.log"

gen=(generate -m "$model" -p "Once upon a time" -n 32 --temp 0 -t 1 -q)
one=$("$bin" "${gen[@]}")
two=$(two_hosts "$bin" "${gen[@]}" --tensor-parallel-size 2)
[ -n "$one" ] && [ "$one" = "$two" ]; check "generate --tp 2 across the hosts prints one rank's text" $?
two=$(two_hosts "$bin" "${gen[@]}" --prefill-context-parallel-size 2 --tensor-parallel-size 2)
[ -n "$one" ] && [ "$one" = "$two" ]; check "generate --pcp 2 --tp 2 across the hosts prints one rank's text" $?

[ $failures = 0 ] || { echo "$failures check(s) failed"; exit 1; }
