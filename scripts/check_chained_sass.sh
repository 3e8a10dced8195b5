#!/usr/bin/env bash
# scripts/check_chained_sass.sh — checks the sm_90a machine code of the chained CUDA kernels
# (kernels/cuda/pdl.cuh): in every kernel that waits (griddepcontrol.wait, SASS `ACQBULK`), no
# store and no load other than a weight load may come before the first wait. Weight loads are
# the ones the GEMVs issue early on purpose: the non-allocating `.NA` loads and the narrow loads
# of the block formats' bytes and scales; a 128-bit load that is not `.NA` is an activation (x)
# load and fails the check. ptxas moves non-coherent loads above the wait, which is how a first
# version of gemv_warp read x before the kernel that writes it had finished; nothing in a test
# without a Hopper GPU would show that.
# Needs nvcc (the build's) and cuobjdump: taken from PATH, else from the nvidia-cuda-cuobjdump
# wheel in a virtual environment under /tmp (PyPI). Run from anywhere: bash scripts/check_chained_sass.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
WORK=${TMPDIR:-/tmp}/fastpath_chained_sass
mkdir -p "$WORK"
if ! command -v cuobjdump > /dev/null || ! command -v nvdisasm > /dev/null; then
  if [ ! -x "$WORK/venv/bin/python" ]; then python3 -m venv "$WORK/venv" > /dev/null; fi
  if [ -z "$(find "$WORK/venv" -name nvdisasm -type f 2>/dev/null | head -n 1)" ]; then
    "$WORK/venv/bin/pip" install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm > /dev/null
  fi
  for tool in cuobjdump nvdisasm; do  # cuobjdump runs nvdisasm from PATH
    t=$(find "$WORK/venv" -name "$tool" -type f | head -n 1)
    chmod +x "$t"
    PATH=$(dirname "$t"):$PATH
  done
fi
CUOBJDUMP=$(command -v cuobjdump)
status=0
for f in gemv gemv_q8 elementwise attention_tiled; do
  "$NVCC" -Isrc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a -x cu -c "src/kernels/cuda/$f.cu" \
    -o "$WORK/$f.o"
  "$CUOBJDUMP" -sass "$WORK/$f.o" > "$WORK/$f.sass"
  python3 - "$WORK/$f.sass" "$f" <<'PY' || status=1
import re, sys
text, name = open(sys.argv[1]).read(), sys.argv[2]
functions = re.split(r"\n\s*Function : ", text)[1:]
waiting = bad = 0
for fn in functions:
    if "ACQBULK" not in fn:
        continue
    waiting += 1
    before = fn.split("ACQBULK", 1)[0]
    for line in before.split("\n"):
        op = re.search(r"\b(LDG\S*|STG\S*|ST\.\S*|ATOM\S*|RED\S*|LDS\S*|STS\S*)", line)
        if not op:
            continue
        o = op.group(1)
        weight_load = o.startswith("LDG") and (".NA." in o or ".128" not in o)
        if not weight_load:
            bad += 1
            print(f"{name}: {fn.split(chr(10))[0].strip()[:110]}\n    {line.strip()[:110]}")
print(f"{name}: {waiting} kernels wait; {bad} activation loads or stores above the wait")
sys.exit(1 if bad or waiting == 0 else 0)
PY
done
exit $status
