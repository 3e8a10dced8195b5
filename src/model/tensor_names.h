// model/tensor_names.h — Hugging Face tensor names <-> fastpath's canonical (GGUF-style) names
// for the Llama-family architectures. One table, used by the safetensors loader and by synth.
#pragma once
#include <string>

namespace fp {

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"; FP8 scales
// "X.weight_scale_inv" -> "<canonical X.weight>_scale_inv". Empty when the name is unknown.
std::string canonical_from_hf(const std::string& hf);

// Gemma 2 and 3's names: Gemma 3's multimodal checkpoint's text-model prefixes ("language_model.model.",
// "model.language_model.") stripped, and its four norms per layer named as llama.cpp's GGUFs
// name them (post_attention_norm, ffn_norm before the FFN, post_ffw_norm). Vision tensors: empty.
std::string canonical_from_hf_gemma(const std::string& hf);

}  // namespace fp
