// model/model.cpp — architecture registry and the shared KV cache allocation.
#include "model/model.h"

#include <map>

#include "core/error.h"
#include "core/log.h"

namespace fp {

namespace {
std::map<std::string, ArchitectureFactory>& registry() {
  static std::map<std::string, ArchitectureFactory> r;
  return r;
}
}  // namespace

bool register_architecture(const std::string& arch, ArchitectureFactory factory) {
  registry()[arch] = std::move(factory);
  return true;
}

std::vector<std::string> registered_architectures() {
  std::vector<std::string> out;
  for (auto& [k, v] : registry()) out.push_back(k);
  return out;
}

std::unique_ptr<Model> build_model(std::shared_ptr<ModelFile> file) {
  auto it = registry().find(file->config.arch);
  if (it == registry().end()) {
    std::string known;
    for (auto& a : registered_architectures()) known += (known.empty() ? "" : ", ") + a;
    fail(file->path, ": no architecture '", file->config.arch, "' (registered: ", known, ")");
  }
  return it->second(std::move(file));
}

std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts) {
  std::shared_ptr<ModelFile> f(load_model_file(path, opts).release());
  log_info("loaded ", path, ": ", f->format, ", ", f->tensors.size(), " tensors, ",
           static_cast<double>(f->file_bytes) / (1 << 20), " MiB in ", f->load_seconds * 1000, " ms");
  return build_model(std::move(f));
}

std::unique_ptr<KvCache> Model::new_cache(int64_t capacity) const {
  const ModelConfig& c = config();
  auto kv = std::make_unique<KvCache>();
  kv->capacity = capacity;
  kv->k.resize(static_cast<size_t>(c.n_layers));
  kv->v.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    kv->k[static_cast<size_t>(l)].assign(static_cast<size_t>(capacity * c.n_kv_heads * c.head_dim), 0.0f);
    kv->v[static_cast<size_t>(l)].assign(static_cast<size_t>(capacity * c.n_kv_heads * c.v_head_dim), 0.0f);
  }
  return kv;
}

}  // namespace fp
