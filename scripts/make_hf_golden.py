#!/usr/bin/env python3
"""scripts/make_hf_golden.py — reference logits from Hugging Face transformers (the independent
oracle) for small random-weight models written by `fastpath synth`, stored in tests/golden/.

The C++ test (tests/hf_golden_test.cpp) rewrites the same models with the same seed, loads them
through both loaders, and compares its logits with these. Needs a venv with torch + transformers:
    python3 -m venv .venv && .venv/bin/pip install torch transformers safetensors
    .venv/bin/python scripts/make_hf_golden.py build/fastpath [CASE_NAME ...]
Cases cover Llama/Qwen2/Qwen3, Gemma 3 (sandwich norms, GeGLU, sliding windows with their own RoPE base) and the MoE architectures (Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V2/V3 with MLA, GLM-4.5, gpt-oss
with sliding windows, sinks and MXFP4 experts, which transformers dequantizes on a CPU);
naming cases regenerates only those.

Cases with "lora" (adapter_config.json keys) also get the logits of the model with a random LoRA
adapter that synth writes beside it (--lora-out), as PEFT's PeftModel applies it (pip install peft);
"lora_type" (f32, f16, bf16) is the adapter's matrix type (PEFT computes with its values in F32).

Cases with "hidden": true also get the final hidden states (transformers' last_hidden_state, after
the model's norm), which `fastpath embed` pools. Cases with "mtp": true also get the logits of the model's multi-token-prediction layer (DeepSeek-V3 /
GLM-4.5, the layer after num_hidden_layers), which transformers loads but never runs. The reference
wires it as vLLM and the DeepSeek-V3 report do, around transformers' own decoder layer class:
row i (i < T-1) feeds eh_proj([enorm(embed(token[i+1])) ; hnorm(h_i)]) (the embedding zeroed at
position 0, as vLLM does) through the layer at position i, where h_i is the model's final hidden
state (after its norm); then the layer's shared_head norm and head give the prediction for token i+2.
"""
import json, os, subprocess, sys, tempfile

import torch
from safetensors.torch import load_file
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
            lora = os.path.join(tmp, case["name"] + "_lora")
            subprocess.run([fastpath, "synth", "--arch", case["arch"], "--config", json.dumps(case["config"]),
                            "--seed", str(case["seed"]), "--out", d] + (["--type", case["type"]] if "type" in case else []) +
                           (["--lora-out", lora, "--lora-config", json.dumps(case["lora"]),
                             "--lora-type", case.get("lora_type", "f32")] if "lora" in case else []),
                           check=True)
            model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                               output_loading_info=True)
            # Every parameter must come from the file: one transformers initialised itself would make
            # the reference random (a checkpoint name it does not map, e.g. Mixtral's experts).
            if info.get("missing_keys"):
                sys.exit(f"{case['name']}: transformers did not find {sorted(info['missing_keys'])[:8]} in the file")
            model.eval()
            ids = torch.tensor([cases["tokens"]])
            with torch.no_grad():
                logits = model(ids).logits[0].to(torch.float32).contiguous()
            path = os.path.join(out_dir, case["name"] + ".logits.f32")
            logits.numpy().astype("<f4").tofile(path)
            print(f"{case['name']}: {tuple(logits.shape)} -> {path}")
            if case.get("hidden"):  # the final hidden states (after the model's norm): what embeddings pool
                with torch.no_grad():
                    hidden = model.model(ids).last_hidden_state[0].to(torch.float32).contiguous()
                path = os.path.join(out_dir, case["name"] + ".hidden.f32")
                hidden.numpy().astype("<f4").tofile(path)
                print(f"{case['name']}: hidden {tuple(hidden.shape)} -> {path}")
            if case.get("mtp"):
                with torch.no_grad():
                    mtp = mtp_logits(model, load_file(os.path.join(d, "model.safetensors")), ids[0])
                path = os.path.join(out_dir, case["name"] + ".mtp_logits.f32")
                mtp.numpy().astype("<f4").tofile(path)
                print(f"{case['name']}: MTP {tuple(mtp.shape)} -> {path}")
            # Last: PeftModel wraps the model's layers in place.
            if "lora" in case:  # the same model with the LoRA adapter synth wrote, as PEFT applies it
                from peft import PeftModel
                with torch.no_grad():
                    adapted = PeftModel.from_pretrained(model, lora)
                    adapted.eval()
                    lora_logits = adapted(ids).logits[0].to(torch.float32).contiguous()
                path = os.path.join(out_dir, case["name"] + ".lora_logits.f32")
                lora_logits.numpy().astype("<f4").tofile(path)
                print(f"{case['name']}: LoRA {tuple(lora_logits.shape)} -> {path}")


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def mtp_logits(model, weights, ids):
    """The first multi-token-prediction layer's logits for rows 0..T-2 (see the module text)."""
    cfg = model.config
    n = cfg.num_hidden_layers
    p = f"model.layers.{n}."
    eps = cfg.rms_norm_eps
    T = ids.shape[0]
    h = model.model(ids[None]).last_hidden_state[0, :T - 1]  # after the final norm
    block = type(model.model.layers[-1])(cfg, layer_idx=n).to(torch.float32)
    own = ("eh_proj.", "enorm.", "hnorm.", "shared_head.", "embed_tokens.")
    state = {k[len(p):]: v.to(torch.float32) for k, v in weights.items() if k.startswith(p) and not k[len(p):].startswith(own)}
    if "mlp.experts.gate_up_proj" in block.state_dict():  # transformers 5 stacks the experts
        E = sum(1 for k in state if k.startswith("mlp.experts.") and k.endswith(".gate_proj.weight"))
        ex = [state.pop(f"mlp.experts.{e}.{w}_proj.weight") for e in range(E) for w in ("gate", "up", "down")]
        state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([ex[3 * e], ex[3 * e + 1]]) for e in range(E)])
        state["mlp.experts.down_proj"] = torch.stack([ex[3 * e + 2] for e in range(E)])
    block.load_state_dict(state, strict=True)
    block.eval()
    emb = model.model.embed_tokens(ids[1:])
    emb[0] = 0  # position 0
    x = torch.cat([rms_norm(emb, weights[p + "enorm.weight"], eps), rms_norm(h, weights[p + "hnorm.weight"], eps)], dim=-1)
    x = x @ weights[p + "eh_proj.weight"].to(torch.float32).T
    pos = torch.arange(T - 1)[None]
    cos_sin = model.model.rotary_emb(x[None], pos)
    mask = torch.full((T - 1, T - 1), float("-inf")).triu(1)[None, None]
    out = block(x[None], attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
    out = (out[0] if isinstance(out, tuple) else out)[0]
    out = rms_norm(out, weights[p + "shared_head.norm.weight"], eps)
    return (out @ weights[p + "shared_head.head.weight"].to(torch.float32).T).contiguous()


if __name__ == "__main__":
    main()
