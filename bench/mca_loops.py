#!/usr/bin/env python3
"""bench/mca_loops.py — static cycle estimates for a kernel's loops, for machines too noisy to time.

For every function whose (demangled) name contains PATTERN, each loop (a backward branch) that
holds an int8 multiply (vpmaddubsw / vpdpbusd) or an FMA is cut out of `objdump -d`, its branches
dropped, and fed to llvm-mca as straight-line code for the given CPU model. Printed per loop:
instructions, multiplies (vpmaddubsw / vpmaddwd / vpdpbusd / FMA), ymm/zmm stack accesses
(spills show up here), and llvm-mca's cycles per iteration. Nested loops are listed apart: the
outer loop's figure includes one pass of the inner body, so compare like with like between two
builds of the same kernel (a before/after pair), not across kernels.

  python3 bench/mca_loops.py build/bench/fastpath_ops_bench 'tile_q6<2, 3>' [--cpu znver3]
  python3 bench/mca_loops.py /tmp/old/fastpath_ops_bench 'tile_q6<2, 3>'    # the build before

llvm-mca assumes every load hits L1 and knows nothing of the memory system, so it bounds the
core's part only; the measured time says the rest (docs/design.md, "Measuring on a noisy VM").
Needs objdump (binutils) and llvm-mca (Debian's `llvm` package). A development tool, not part
of the engine.
"""
import argparse
import re
import subprocess
import sys

MULS = ("vpmaddubsw", "vpmaddwd", "vpdpbusd", "vfmadd", "vdpbf16ps")


def functions(binary, pattern):
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", binary], capture_output=True, text=True,
                         check=True).stdout
    cur, body = None, []
    for line in dis.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            if cur and pattern in cur:
                yield cur, body
            cur, body = m.group(2), []
            continue
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)$", line)
        if m and cur:
            body.append((int(m.group(1), 16), m.group(2)))
    if cur and pattern in cur:
        yield cur, body


def loops(body):
    for addr, ins in body:
        m = re.match(r"j\w+\s+([0-9a-f]+)", ins)
        if m and int(m.group(1), 16) < addr:
            span = [i for a, i in body if int(m.group(1), 16) <= a <= addr]
            if any(k in i for i in span for k in MULS):
                yield int(m.group(1), 16), addr, span


def mca_cycles(instructions, cpu, iterations=200):
    src = [re.sub(r"\s+<.*>$", "", i) for i in instructions]
    src = [i for i in src if not re.match(r"(j\w+\s|nop|cs nop|data16|xchg\s+%ax,%ax)", i)]
    r = subprocess.run(["llvm-mca", "-mcpu=" + cpu, "-iterations=%d" % iterations], input="\n".join(src) + "\n",
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("Total Cycles:"):
            return len(src), int(line.split()[-1]) / iterations
    sys.stderr.write(r.stderr[:2000])
    return len(src), float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("pattern", help="part of the demangled function name, e.g. 'tile_q6<2, 3>'")
    ap.add_argument("--cpu", default="znver3", help="llvm-mca -mcpu (znver3, znver4, sapphirerapids, ...)")
    a = ap.parse_args()
    found = False
    for name, body in functions(a.binary, a.pattern):
        for start, end, span in loops(body):
            found = True
            n, cyc = mca_cycles(span, a.cpu)
            count = lambda k: sum(k in i for i in span)  # noqa: E731
            stack = sum(("%rsp" in i or "%rbp" in i) and ("ymm" in i or "zmm" in i) for i in span)
            print("%-50.50s loop %x-%x: %3d instr, %2d vpmaddubsw, %2d vpmaddwd, %2d vpdpbusd, %2d fma, %2d stack, "
                  "%.1f cycles/iter (%s)" % (name, start, end, n, count("vpmaddubsw"), count("vpmaddwd"),
                                             count("vpdpbusd"), count("vfmadd"), stack, cyc, a.cpu))
    if not found:
        sys.exit("no loop with a multiply in a function matching %r" % a.pattern)


if __name__ == "__main__":
    main()
