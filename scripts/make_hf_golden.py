#!/usr/bin/env python3
"""scripts/make_hf_golden.py — reference logits from Hugging Face transformers (the independent
oracle) for small random-weight models written by `fastpath synth`, stored in tests/golden/.

The C++ test (tests/hf_golden_test.cpp) rewrites the same models with the same seed, loads them
through both loaders, and compares its logits with these. Needs a venv with torch + transformers:
    python3 -m venv .venv && .venv/bin/pip install torch transformers safetensors
    .venv/bin/python scripts/make_hf_golden.py build/fastpath [CASE_NAME ...]
Cases cover Llama/Qwen2/Qwen3 and the MoE architectures (Qwen3-MoE, DeepSeek-V2/V3 with MLA, GLM-4.5);
naming cases regenerates only those.
"""
import json, os, subprocess, sys, tempfile

import torch
from transformers import AutoModelForCausalLM

CASES_FILE = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "hf_cases.json")


def main():
    fastpath = sys.argv[1] if len(sys.argv) > 1 else "build/fastpath"
    cases = json.load(open(CASES_FILE))
    out_dir = os.path.dirname(CASES_FILE)
    only = set(sys.argv[2:])
    for case in cases["cases"]:
        if only and case["name"] not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, case["name"])
            subprocess.run([fastpath, "synth", "--arch", case["arch"], "--config", json.dumps(case["config"]),
                            "--seed", str(case["seed"]), "--out", d], check=True)
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
            model.eval()
            ids = torch.tensor([cases["tokens"]])
            with torch.no_grad():
                logits = model(ids).logits[0].to(torch.float32).contiguous()
            path = os.path.join(out_dir, case["name"] + ".logits.f32")
            logits.numpy().astype("<f4").tofile(path)
            print(f"{case['name']}: {tuple(logits.shape)} -> {path}")


if __name__ == "__main__":
    main()
