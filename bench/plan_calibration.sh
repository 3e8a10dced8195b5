#!/usr/bin/env bash
# bench/plan_calibration.sh MODEL.gguf — `fastpath plan` against measured runs on this machine
# (issue 7's calibration): `fastpath bench` prefill 128 and decode as 1 rank x 2 threads and as
# 2 MPI ranks x 1 thread with --tp 2, then the planner's predictions for the same shapes, printed
# side by side with the relative error (predicted / measured - 1). Predictions come three ways:
#   roofline    a hardware file from the ceilings bench reported (read bandwidth; int8 GOP/s for
#               Q8_0/Q4 weights, f32 FMA GFLOP/s otherwise), no efficiencies: the upper bound.
#               Under mpirun bench reports the machine's ceiling (all ranks together), so each of
#               the 2 devices gets half of it. The link as `fastpath bench-comm` measures it.
#   calibrated  the same with compute_efficiency / bandwidth_efficiency fitted on the 1-rank run
#               only (measured prefill / roofline prefill, measured decode / roofline decode): its
#               2-rank rows are a prediction of runs the fit never saw — the error that counts.
#   shipped     hardware/cpu-2rank-this-vm.json as committed (the 2-rank run only).
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
mpirun --oversubscribe -np 2 "$bin" bench-comm -q --json > "$tmp/comm.json"
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$tmp" "$bin" "$model" "$gen" hardware/cpu-2rank-this-vm.json <<'EOF'
import json, subprocess, sys
tmp, binary, model, gen, shipped_path = sys.argv[1:6]
shipped = json.load(open(shipped_path))
r1, r2 = (json.load(open(f"{tmp}/{n}.json")) for n in ("r1", "r2"))
# The link between the 2 ranks, measured (bench-comm): used by the measured files instead of the
# shipped file's figures.
link = dict(shipped["interconnect"], kind="shared memory (OpenMPI vader), measured by bench-comm",
            **json.load(open(f"{tmp}/comm.json"))["interconnect"])

def plan(hw, input_len, output_len):
    path = f"{tmp}/hw.json"
    json.dump(hw, open(path, "w"))
    out = subprocess.run([binary, "plan", "--json", "-m", model, "--hardware", path, "--input-len", str(input_len),
                          "--output-len", str(output_len), "--concurrency", "1"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)

def predict(hw, layout):
    # Prefill: one prompt of 128. Decode: bench steps positions 1..gen, a mean context of ~gen/2,
    # which plan's decode has with a 1-token prompt and gen outputs.
    pf = next(l for l in plan(hw, 128, 1)["layouts"] if l["layout"] == layout)["prefill"]
    de = next(l for l in plan(hw, 1, int(gen))["layouts"] if l["layout"] == layout)["decode"][0]
    return (pf["input_tps"], pf), (de["output_tps"], de)

def hardware(run, devices, **extra):
    c = run["ceiling"]  # the machine's (under mpirun: every rank's together)
    integer = any(q in run.get("weight_types", "").lower() for q in ("q8_", "q4_", "q5_", "q6_"))
    peak = (c["int8_gops"] if integer else c["fma_gflops"]) / 1000
    return dict(shipped, name=f"measured, {devices} device(s)", devices=devices, interconnect=link,
                memory_bandwidth_gbps=c["read_gbps"] / devices, compute_tflops=peak / devices, **extra)

roof1 = hardware(r1, 1)
(pf1, _), (de1, _) = predict(roof1, "TP1")
eff = dict(compute_efficiency=min(1.0, r1["prefill_tps"] / pf1), bandwidth_efficiency=min(1.0, r1["decode_tps"] / de1))
rows = []
for run, layout, m, hws in (("1 rank x 2 threads", "TP1", r1, [("roofline", roof1), ("calibrated", hardware(r1, 1, **eff))]),
                            ("2 ranks x 1 thread, --tp 2", "TP2", r2,
                             [("roofline", hardware(r2, 2)), ("calibrated", hardware(r2, 2, **eff)), ("shipped", shipped)])):
    for src, hw in hws:
        (ppf, bpf), (pde, bde) = predict(hw, layout)
        rows.append((run, src, "prefill 128", ppf, m["prefill_tps"], bpf))
        rows.append((run, src, "decode", pde, m["decode_tps"], bde))
print(f"{'run':28} {'hardware':10} {'phase':12} {'predicted':>10} {'measured':>10} {'error':>8}  predicted split (compute / memory / comm ms)")
for run, src, phase, pred, meas, b in rows:
    print(f"{run:28} {src:10} {phase:12} {pred:10.1f} {meas:10.1f} {100 * (pred / meas - 1):+7.0f}%  "
          f"{b['bottleneck']} ({b['compute_ms']:.2f} / {b['memory_ms']:.2f} / {b['comm_ms']:.3f})")
print(f"fitted on the 1-rank run: compute_efficiency {eff['compute_efficiency']:.3f}, "
      f"bandwidth_efficiency {eff['bandwidth_efficiency']:.3f} (the 1-rank calibrated rows are 0% by construction, "
      "unless a fraction was capped at 1)")
print("calibrated hardware file for 2 ranks (save it to plan other layouts of this model type here):")
print(json.dumps(dict(hardware(r2, 2, **eff), name="this VM: 2 MPI ranks x 1 thread, calibrated"), sort_keys=True))
print(f"link between the 2 ranks (bench-comm): {link['bandwidth_gbps']:.2f} GB/s bus bandwidth, "
      f"{link['latency_us']:.2f} us per ring step")
for name, run in (("1 rank x 2 threads", r1), ("2 ranks (all ranks together)", r2)):
    c = run["ceiling"]
    print(f"ceilings bench reported, {name}: read {c['read_gbps']:.1f} GB/s, f32 FMA {c['fma_gflops']:.0f} GFLOP/s, "
          f"int8 {c['int8_gops']:.0f} GOP/s")
EOF
