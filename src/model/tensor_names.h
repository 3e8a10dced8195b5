// model/tensor_names.h — Hugging Face tensor names <-> fastpath's canonical (GGUF-style) names
// for the Llama-family architectures. One table, used by the safetensors loader and by synth.
#pragma once
#include <string>

namespace fp {

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"; FP8 scales
// "X.weight_scale_inv" -> "<canonical X.weight>_scale_inv". Empty when the name is unknown.
std::string canonical_from_hf(const std::string& hf);

// A multimodal checkpoint's text-model tensor as the text model alone names it: the prefixes
// "language_model.model." and "model.language_model." become "model.", "language_model.lm_head."
// "lm_head."; any other name is returned as it is (vision tensors then map to nothing).
std::string text_model_name(const std::string& hf);

// Gemma 2 and 3's names: text_model_name's, and the four norms per layer named as llama.cpp's
// GGUFs name them (post_attention_norm, ffn_norm before the FFN, post_ffw_norm).
std::string canonical_from_hf_gemma(const std::string& hf);

}  // namespace fp
