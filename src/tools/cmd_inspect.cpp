// tools/cmd_inspect.cpp — `fastpath inspect`: what the loader understood of a model file.
#include <cstdio>
#include <iostream>
#include <map>

#include "core/log.h"
#include "model/model.h"
#include "tools/common.h"

namespace fp::tools {

void add_inspect(CLI::App& app) {
  struct Opts {
    std::string model, tokenizer;
    bool all_tensors = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("inspect", "print a model's architecture, shapes, dtypes, tokenizer and metadata");
  cmd->add_option("-m,--model", o->model, "a .gguf file, a llama2.c .bin, or a Hugging Face directory")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.bin for a llama2.c checkpoint");
  cmd->add_flag("--all-tensors", o->all_tensors, "list every tensor (default: the first 64)");
  cmd->callback([o] {
    LoadOptions lo;
    lo.tokenizer_path = o->tokenizer;
    lo.prefault = false;
    std::shared_ptr<ModelFile> mf(load_model_file(o->model, lo).release());
    std::ostream& out = std::cout;
    out << "file:         " << mf->path << " (" << mf->format << ", " << mf->file_bytes << " bytes)\n";
    out << "model:        " << mf->config.name << "\n";
    out << "config:       " << mf->config.describe() << "\n";
    out << "tokenizer:    " << (mf->tokenizer ? mf->tokenizer->describe() : std::string("none")) << "\n";
    for (auto& n : mf->notes) out << "loader:       " << n << "\n";
    std::map<std::string, std::pair<int, int64_t>> by_type;  // dtype -> (tensors, bytes)
    int64_t params = 0;
    for (auto& [n, t] : mf->tensors) {
      auto& e = by_type[dtype_name(t.dtype)];
      e.first++;
      e.second += t.nbytes();
      params += t.numel();
    }
    out << "tensors:      " << mf->tensors.size() << ", " << params << " parameters;";
    for (auto& [ty, e] : by_type) out << ' ' << ty << " x" << e.first << " (" << e.second << " B)";
    out << "\n";
    int shown = 0;
    for (auto& [n, t] : mf->tensors) {
      if (!o->all_tensors && shown++ >= 64) {
        out << "  ... (" << mf->tensors.size() - 64 << " more; --all-tensors lists them)\n";
        break;
      }
      char line[256];
      std::snprintf(line, sizeof line, "  %-36s %-8s %s%s\n", n.c_str(), dtype_name(t.dtype), t.shape_str().c_str(),
                    t.block_scale ? " (block-scaled)" : "");
      out << line;
    }
    out << "metadata:     " << mf->metadata.size() << " keys\n";
    for (auto& [k, v] : mf->metadata) out << "  " << k << " = " << v << "\n";
    // Building the architecture checks every shape against the config.
    auto model = build_model(mf);
    out << "check:        every tensor the " << mf->config.arch << " architecture needs is present with the expected shape\n";
    const KvLayout kv = model->kv_layout();
    const ModelConfig& c = mf->config;
    out << "kv cache:     " << kv.bytes_per_token() << " bytes per token (" << kv.n_layers << " layers x " << kv.k_width + kv.v_width
        << " f32 values";
    if (c.mla.kv_lora_rank > 0) {
      // What caching the expanded per-head K and V would take instead of MLA's latent row.
      const int64_t expanded = c.n_layers * c.n_heads * (c.head_dim + c.v_head_dim) * 4;
      out << ": MLA latent kv_lora " << c.mla.kv_lora_rank << " + rope " << c.rot_dim << "; expanded K/V would be " << expanded;
    }
    KvLayout half = kv;
    half.dtype = DType::F16;
    out << "); " << half.bytes_per_token() << " in f16/bf16 (--kv-cache-dtype)\n";
    // Whether the file kept its multi-token-prediction layer (some conversions and quants drop it).
    if (c.mtp_layers > 0) {
      const std::string p = "blk." + std::to_string(c.n_layers) + ".";
      const bool has = mf->find(p + "nextn.eh_proj.weight") && mf->find(p + "attn_norm.weight");
      out << "mtp:          " << c.mtp_layers << " multi-token-prediction layer(s) after the " << c.n_layers << "; "
          << (has ? "the first drafts with --speculative-method mtp" : "declared, but " + p + "nextn.eh_proj / " + p +
                                                                             "attn_norm are not in the file: no MTP drafts")
          << "\n";
    }
  });
}

}  // namespace fp::tools
