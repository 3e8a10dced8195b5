// model/config.cpp — validation, description and RoPE frequencies of a ModelConfig.
#include "model/config.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace fp {

void ModelConfig::validate(const std::string& where) const {
  auto need = [&](bool ok, const char* field, int64_t v, const char* expect) {
    if (!ok) fail(where, ": ", field, " = ", v, " (", expect, ")");
  };
  need(n_vocab > 0, "vocab size", n_vocab, "must be positive");
  need(dim > 0, "hidden size", dim, "must be positive");
  need(n_layers > 0, "layer count", n_layers, "must be positive");
  need(n_heads > 0, "attention head count", n_heads, "must be positive");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "kv head count", n_kv_heads, "must divide the head count");
  need(head_dim > 0 && head_dim % 2 == 0, "head dim", head_dim, "must be positive and even");
  need(rot_dim > 0 && rot_dim <= head_dim && rot_dim % 2 == 0, "rope dimension count", rot_dim, "must be even and <= head dim");
  need(hidden_dim > 0, "feed-forward length", hidden_dim, "must be positive");
  need(max_context > 0, "context length", max_context, "must be positive");
  FP_CHECK(rms_eps > 0 && std::isfinite(rms_eps), where, ": rms norm epsilon ", rms_eps, " must be positive");
  FP_CHECK(rope_theta > 0 && std::isfinite(rope_theta), where, ": rope theta ", rope_theta, " must be positive");
  FP_CHECK(rope_scaling.factor > 0, where, ": rope scaling factor ", rope_scaling.factor, " must be positive");
}

std::string ModelConfig::describe() const {
  std::ostringstream os;
  os << "arch " << arch << " (" << source << "), vocab " << n_vocab << ", dim " << dim << ", layers " << n_layers
     << ", heads " << n_heads << " (kv " << n_kv_heads << ", head dim " << head_dim << "), ffn " << hidden_dim
     << ", context " << max_context << ", rope " << (rope_style == RopeStyle::NeoX ? "neox" : "adjacent-pairs")
     << " theta " << rope_theta << " dims " << rot_dim;
  if (rope_scaling.type != "none") os << " scaling " << rope_scaling.type << " x" << rope_scaling.factor;
  os << ", rms eps " << rms_eps << (tied_output ? ", tied output" : ", untied output");
  if (qkv_bias) os << ", qkv bias";
  if (qk_norm) os << ", q/k norm";
  return os.str();
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  std::vector<float> f(static_cast<size_t>(rot_dim / 2));
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    double inv = std::pow(static_cast<double>(rope_theta), -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    if (rope_scaling.type == "linear") {
      inv /= rope_scaling.factor;
    } else if (rope_scaling.type == "llama3") {
      // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
      double old_ctx = static_cast<double>(rope_scaling.original_context);
      double low_wl = old_ctx / rope_scaling.low_freq_factor, high_wl = old_ctx / rope_scaling.high_freq_factor;
      double wl = 2 * M_PI / inv;
      if (wl > low_wl) {
        inv /= rope_scaling.factor;
      } else if (wl >= high_wl) {
        double smooth = (old_ctx / wl - rope_scaling.low_freq_factor) /
                        (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
        inv = (1 - smooth) * inv / rope_scaling.factor + smooth * inv;
      }
    }
    f[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return f;
}

}  // namespace fp
