#!/usr/bin/env python3
"""scripts/make_quant_golden.py — dequantized values of every GGUF block format fastpath reads,
computed by llama.cpp's own Python package (`gguf`, the independent oracle), stored in
tests/golden/quant_blocks.bin for tests/quant_golden_test.cpp.

The blocks are random bytes (every bit of the quants, scales and high-bit masks random) with
their f16 scale fields set to random finite values, so a wrong bit position anywhere in a
dequantizer shows. Needs a venv with the package:
    python3 -m venv .venv && .venv/bin/pip install gguf numpy
    .venv/bin/python scripts/make_quant_golden.py

File layout (little-endian): b"FPQG", u32 count, then per format: 8-byte name (NUL-padded),
u32 values, u32 bytes, the raw blocks, then the values as f32.
"""
import os
import struct

import numpy as np
import gguf
from gguf.quants import dequantize

# Byte offsets of each format's f16 fields inside one block (ggml's block layouts).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}
VALUES = {"K": 3 * 256, "legacy": 8 * 32}


def main():
    rng = np.random.default_rng(20261202)
    out = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "quant_blocks.bin")
    entries = []
    for name, fields in F16_FIELDS.items():
        qtype = getattr(gguf.GGMLQuantizationType, name)
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n = VALUES["K"] if block_size == 256 else VALUES["legacy"]
        blocks = rng.integers(0, 256, size=(n // block_size, type_size), dtype=np.uint8)
        for off in fields:
            scale = rng.uniform(0.001, 0.1, size=blocks.shape[0]) * rng.choice([-1.0, 1.0], size=blocks.shape[0])
            blocks[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
        values = dequantize(blocks.reshape(-1), qtype).astype("<f4").reshape(-1)
        assert values.size == n and np.all(np.isfinite(values))
        entries.append((name, n, blocks.tobytes(), values.tobytes()))
    with open(out, "wb") as f:
        f.write(b"FPQG" + struct.pack("<I", len(entries)))
        for name, n, raw, vals in entries:
            f.write(name.encode().ljust(8, b"\0") + struct.pack("<II", n, len(raw)) + raw + vals)
    print(f"{len(entries)} formats -> {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
