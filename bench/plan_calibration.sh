#!/usr/bin/env bash
# bench/plan_calibration.sh MODEL.gguf — `fastpath plan` against measured runs on this machine
# (issue 7's calibration): `fastpath bench` prefill 128 and decode as 1 rank x 2 threads and as
# 2 MPI ranks x 1 thread with --tp 2, then the planner's predictions for the same shapes, printed
# side by side with the relative error (predicted / measured - 1). Predictions come three ways:
#   shipped   hardware/cpu-2rank-this-vm.json as committed (the 2-rank run only)
#   bench     a hardware file written from the ceilings bench reported in this run (its cached
#             calibration; read bandwidth the larger of that and probes beside the decode runs;
#             int8 GOP/s for Q8_0/Q4 weights, f32 FMA GFLOP/s otherwise) with the shipped file's
#             link figures: for 1 rank x 2 threads as one device, and for the 2 ranks.
# Needs a build with MPI (build/fastpath) and python3. GEN (default 64) sets the decode length,
# REPS (default 3) the repetitions; the weights are copied into memory (--no-mmap, as plan assumes:
# read from memory at the measured bandwidth, not faulted in from the page cache).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/plan_calibration.sh MODEL.gguf}
gen=${GEN:-64}
reps=${REPS:-3}
bin=build/fastpath
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "$(date -u '+%F %T UTC'), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" bench -q --json --no-mmap -m "$model" -p 128 -n "$gen" -t 2 -r "$reps" > "$tmp/r1.json"
mpirun --oversubscribe -np 2 "$bin" bench -q --json --no-mmap -m "$model" -p 128 -n "$gen" --tp 2 -t 1 -r "$reps" > "$tmp/r2.json"
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# Hardware files from the measured ceilings (the 2-rank run's are one rank's, at 1 thread).
python3 - "$tmp" hardware/cpu-2rank-this-vm.json <<'EOF'
import json, sys
tmp, shipped = sys.argv[1], json.load(open(sys.argv[2]))
for run, devices in (("r1", 1), ("r2", 2)):
    r = json.load(open(f"{tmp}/{run}.json"))
    c = r["ceiling"]
    integer = any(q in r.get("weight_types", "").lower() for q in ("q8_", "q4_", "q5_", "q6_"))  # "q8_0:1190MiB f32:..."
    hw = dict(shipped, name=f"measured {run}", devices=devices, memory_bandwidth_gbps=c["read_gbps"],
              compute_tflops=(c["int8_gops"] if integer else c["fma_gflops"]) / 1000)
    json.dump(hw, open(f"{tmp}/hw-{run}.json", "w"))
EOF

plan() {  # plan HW INPUT OUTPUT -> JSON
  "$bin" plan --json -m "$model" --hardware "$1" --input-len "$2" --output-len "$3" --concurrency 1
}
# Prefill: one prompt of 128. Decode: bench steps positions 1..gen, a mean context of ~gen/2,
# which plan's decode has with a 1-token prompt and gen outputs.
for hw in hardware/cpu-2rank-this-vm.json "$tmp/hw-r1.json" "$tmp/hw-r2.json"; do
  tag=$(basename "$hw" .json)
  plan "$hw" 128 1 > "$tmp/plan-prefill-$tag.json"
  plan "$hw" 1 "$gen" > "$tmp/plan-decode-$tag.json"
done

python3 - "$tmp" <<'EOF'
import json, sys
tmp = sys.argv[1]
def load(n): return json.load(open(f"{tmp}/{n}.json"))
def layout(plan, name):
    return next(l for l in plan["layouts"] if l["layout"] == name)
rows = []  # (run, hardware, layout, measured json, prefix)
for run, layout_name, hws in (("1 rank x 2 threads", "TP1", ["hw-r1"]),
                              ("2 ranks x 1 thread, --tp 2", "TP2", ["cpu-2rank-this-vm", "hw-r2"])):
    m = load("r1" if layout_name == "TP1" else "r2")
    for hw in hws:
        src = "shipped" if hw == "cpu-2rank-this-vm" else "bench"
        pf = layout(load(f"plan-prefill-{hw}"), layout_name)
        de = layout(load(f"plan-decode-{hw}"), layout_name)
        for phase, meas, pred, b in (("prefill 128", m["prefill_tps"], pf["prefill"]["input_tps"], pf["prefill"]),
                                     ("decode", m["decode_tps"], de["decode"][0]["output_tps"], de["decode"][0])):
            rows.append((run, src, phase, pred, meas, b))
print(f"{'run':28} {'hardware':9} {'phase':12} {'predicted':>10} {'measured':>10} {'error':>8}  predicted split (compute / memory / comm ms)")
for run, src, phase, pred, meas, b in rows:
    print(f"{run:28} {src:9} {phase:12} {pred:10.1f} {meas:10.1f} {100 * (pred / meas - 1):+7.0f}%  "
          f"{b['bottleneck']} ({b['compute_ms']:.2f} / {b['memory_ms']:.2f} / {b['comm_ms']:.3f})")
for run in ("r1", "r2"):
    c = load(run)["ceiling"]
    print(f"ceilings bench reported in {run} ({'2 threads' if run == 'r1' else 'rank 0, 1 thread'}): read {c['read_gbps']:.1f} GB/s, "
          f"f32 FMA {c['fma_gflops']:.0f} GFLOP/s, int8 {c['int8_gops']:.0f} GOP/s")
EOF
