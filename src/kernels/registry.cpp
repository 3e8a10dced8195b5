// kernels/registry.cpp — forced-kernel overrides and the cross-op invalidation hook.
#include "kernels/registry.h"

namespace fp {

KernelOverrides& KernelOverrides::global() {
  static KernelOverrides o;
  return o;
}

void KernelOverrides::force(const std::string& op, const std::string& kernel) {
  auto& cat = kernel_catalog();
  auto it = cat.find(op);
  FP_CHECK(it != cat.end(), "--kernel ", op, "=", kernel, ": no op named '", op, "'");
  bool known = false;
  for (auto& k : it->second) known |= k == kernel;
  if (!known) {
    std::string names;
    for (auto& k : it->second) names += (names.empty() ? "" : ", ") + k;
    fail("--kernel ", op, "=", kernel, ": op '", op, "' has no kernel named '", kernel, "' (registered: ", names, ")");
  }
  forced_[op] = kernel;
  invalidate_all_dispatch();
}

void KernelOverrides::clear() {
  forced_.clear();
  invalidate_all_dispatch();
}

const std::string* KernelOverrides::forced(const std::string& op) const {
  auto it = forced_.find(op);
  return it == forced_.end() ? nullptr : &it->second;
}

std::map<std::string, std::vector<std::string>>& kernel_catalog() {
  static std::map<std::string, std::vector<std::string>> c;
  return c;
}

namespace {
std::vector<std::function<void()>>& invalidators() {
  static std::vector<std::function<void()>> v;
  return v;
}
}  // namespace

void register_invalidator(std::function<void()> fn) { invalidators().push_back(std::move(fn)); }

void invalidate_all_dispatch() {
  for (auto& fn : invalidators()) fn();
}

}  // namespace fp
