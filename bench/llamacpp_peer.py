#!/usr/bin/env python3
"""bench/llamacpp_peer.py — llama.cpp (through llama-cpp-python) timed the way `fastpath bench`
times itself, for a side-by-side table on the same GGUF file, machine and thread count.

  prefill P: one fresh context, P random token ids evaluated in one call (llama.cpp splits them
             into its micro-batches of n_ubatch), logits of the last token only;
  decode N:  one fresh context, one token evaluated, then N more one at a time (timed);
  each after WARMUP untimed runs, REPS timed runs: median, min and max tokens/s.

  PY=/work/.venv-peers/bin/python
  $PY bench/llamacpp_peer.py --model M.gguf -p 256 -n 32 -r 5 -t 2 [--lora A.gguf] [--json out.json]

A bench tool, not part of the engine (which has no Python at run time). Needs llama-cpp-python
(pip builds it from source with -march=native, llama.cpp's default). On a CPU with AMX that
build's AMX-INT8 backend crashed on the first Q4_0 / Q4_K prefill (llama-cpp-python 0.3.36,
SIGSEGV in ggml_backend_amx_mul_mat, llama.cpp issue #20824); build it without AMX instead:
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
    -DGGML_AMX_BF16=OFF" pip install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36
(--no-cache-dir: pip otherwise reuses the wheel it built before, whatever CMAKE_ARGS say).
"""
import argparse
import json
import random
import statistics
import sys
import time


def stats(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=256)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ubatch", type=int, default=512, help="llama.cpp n_ubatch (its default is 512)")
    ap.add_argument("--mmap", action="store_true", help="memory-map the weights (default: read them in)")
    ap.add_argument("--lora", help="a llama.cpp GGUF LoRA adapter to run with (lora_path, scale 1)")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()

    import llama_cpp  # imported late so --help works without it

    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.n_prompt + a.n_gen + 16, n_batch=max(a.n_prompt, 1),
                          n_ubatch=a.ubatch, n_threads=a.threads, n_threads_batch=a.threads,
                          use_mmap=a.mmap, logits_all=False, verbose=False, seed=1,
                          **({"lora_path": a.lora} if a.lora else {}))
    n_vocab = llm.n_vocab()
    rng = random.Random(1)
    tok = lambda: rng.randrange(10, n_vocab - 1)  # noqa: E731  (skip the first ids: control tokens)
    out = {"peer": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__, "model": a.model,
           "threads": a.threads, "n_prompt": a.n_prompt, "n_gen": a.n_gen, "reps": a.reps}

    if a.n_prompt > 0:
        tps = []
        for r in range(a.warmup + a.reps):
            ids = [tok() for _ in range(a.n_prompt)]
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids)
            sec = time.perf_counter() - t0
            if r >= a.warmup:
                tps.append(a.n_prompt / sec)
        out["prefill_tps"] = stats(tps)
    if a.n_gen > 0:
        tps = []
        for r in range(a.warmup + a.reps):
            llm.reset()
            llm.eval([tok()])
            t0 = time.perf_counter()
            for _ in range(a.n_gen):
                llm.eval([tok()])
            sec = time.perf_counter() - t0
            if r >= a.warmup:
                tps.append(a.n_gen / sec)
        out["decode_tps"] = stats(tps)

    for k in ("prefill_tps", "decode_tps"):
        if k in out:
            s = out[k]
            print("%-12s %10.2f tok/s  (min %.2f, max %.2f)" % (k.split("_")[0], s["median"], s["min"], s["max"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
