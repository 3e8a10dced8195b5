// tokenizer/chat_template.cpp — finding a model's chat template (tokenizer_config.json,
// chat_template.jinja/.json, GGUF metadata), its special tokens, and rendering it (or the plain
// fallback) with the variables transformers passes.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "tokenizer/jinja.h"

namespace fp {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FP_CHECK(in, path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson read_json(const std::string& path) {
  try {
    return ojson::parse(read_text(path));
  } catch (const ojson::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

// A special token in tokenizer_config.json: a string or an AddedToken object {"content": ...}.
std::string token_text(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

// transformers' special_tokens_map: the named special tokens that are set.
ojson special_tokens_of(const ojson& cfg) {
  ojson out = ojson::object();
  if (!cfg.is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!cfg.contains(key)) continue;
    const std::string t = token_text(cfg[key]);
    if (!t.empty()) out[key] = t;
  }
  if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array()) {
    ojson list = ojson::array();
    for (const auto& v : cfg["additional_special_tokens"]) {
      const std::string t = token_text(v);
      if (!t.empty()) list.push_back(t);
    }
    if (!list.empty()) out["additional_special_tokens"] = std::move(list);
  }
  return out;
}

// The `chat_template` field: a string, or a list of {"name", "template"} from which `name` is taken.
std::string select_template(const ojson& field, const std::string& name, const std::string& where) {
  if (field.is_null()) return {};
  if (field.is_string()) return field.get<std::string>();
  FP_CHECK(field.is_array(), where, ": chat_template must be a string or a list of {name, template}, got ",
           field.type_name());
  std::string names;
  for (const auto& t : field) {
    FP_CHECK(t.is_object() && t.contains("name") && t["name"].is_string() && t.contains("template") &&
                 t["template"].is_string(),
             where, ": each chat_template entry needs string fields 'name' and 'template'");
    if (t["name"].get<std::string>() == name) return t["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
  }
  fail(where, ": no chat template named '", name, "' (available: ", names, ")");
}

ojson template_vars(const ojson& messages, bool add_generation_prompt, const ojson& special_tokens,
                    const ojson& extra_vars) {
  FP_CHECK(messages.is_array(), "chat messages must be a JSON array, got ", messages.type_name());
  FP_CHECK(extra_vars.is_object() || extra_vars.is_null(), "chat template variables must be a JSON object, got ",
           extra_vars.type_name());
  ojson vars = ojson::object();
  vars["messages"] = messages;
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : special_tokens.items()) vars[k] = v;
  if (extra_vars.is_object())
    for (const auto& [k, v] : extra_vars.items()) vars[k] = v;
  return vars;
}

}  // namespace

std::string chat_content_text(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return {};
  if (content.is_array()) {
    std::string out;
    for (const auto& part : content)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
    return out;
  }
  return content.dump();
}

ojson to_json(const std::vector<ChatMessage>& messages) {
  ojson out = ojson::array();
  for (const auto& m : messages) {
    ojson j = ojson::object();
    j["role"] = m.role;
    j["content"] = m.content;
    if (m.extra.is_object())
      for (const auto& [k, v] : m.extra.items()) j[k] = v;
    out.push_back(std::move(j));
  }
  return out;
}

std::string render_plain_chat(const ojson& messages, bool add_generation_prompt) {
  FP_CHECK(messages.is_array(), "chat messages must be a JSON array, got ", messages.type_name());
  std::string out;
  for (const auto& m : messages) {
    FP_CHECK(m.is_object(), "each chat message must be a JSON object");
    const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "user";
    out += role + ": " + (m.contains("content") ? chat_content_text(m["content"]) : std::string()) + "\n";
  }
  if (add_generation_prompt) out += "assistant: ";
  return out;
}

std::string render_chat(const std::string& template_src, const ojson& messages, bool add_generation_prompt,
                        const std::string& bos_token, const std::string& eos_token, const ojson& extra_vars) {
  ojson special = ojson::object();
  if (!bos_token.empty()) special["bos_token"] = bos_token;
  if (!eos_token.empty()) special["eos_token"] = eos_token;
  return ChatTemplate(template_src, std::move(special), "chat template").render(messages, add_generation_prompt, extra_vars);
}

ChatTemplate::ChatTemplate(std::string source, ojson special_tokens, std::string origin)
    : source_(std::move(source)), origin_(std::move(origin)), special_tokens_(std::move(special_tokens)) {
  if (!special_tokens_.is_object()) special_tokens_ = ojson::object();
  if (!source_.empty()) compiled_ = std::make_unique<jinja::Template>(source_, origin_);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const ojson& messages, bool add_generation_prompt, const ojson& extra_vars) const {
  if (!compiled_) return render_plain_chat(messages, add_generation_prompt);
  return compiled_->render(template_vars(messages, add_generation_prompt, special_tokens_, extra_vars));
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path, const std::string& name) {
  const ojson cfg = read_json(path);
  FP_CHECK(cfg.is_object(), path, ": top level is not a JSON object");
  const std::string src = cfg.contains("chat_template") ? select_template(cfg["chat_template"], name, path) : "";
  return ChatTemplate(src, special_tokens_of(cfg), path + " (chat_template)");
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& gguf) {
  const std::string src = gguf.get_string("tokenizer.chat_template", "");
  ojson special = ojson::object();
  if (const auto* tokens = gguf.get_string_array("tokenizer.ggml.tokens")) {
    for (const auto& [key, field] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                                     std::pair{"eos_token", "tokenizer.ggml.eos_token_id"}}) {
      if (!gguf.has(field)) continue;
      const uint64_t id = gguf.get_uint(field);
      if (id < tokens->size()) special[key] = (*tokens)[id];
    }
  }
  return ChatTemplate(src, std::move(special), gguf.path() + " (tokenizer.chat_template)");
}

ChatTemplate ChatTemplate::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  FP_CHECK(file_exists(path), path, ": no such file or directory");
  if (is_directory(path)) {
    const fs::path dir(path);
    const std::string cfg_path = (dir / "tokenizer_config.json").string();
    const ojson special = file_exists(cfg_path) ? special_tokens_of(read_json(cfg_path)) : ojson::object();
    const std::string jinja_path = (dir / "chat_template.jinja").string();
    if (file_exists(jinja_path)) return ChatTemplate(read_text(jinja_path), special, jinja_path);
    const std::string json_path = (dir / "chat_template.json").string();
    if (file_exists(json_path)) {
      const ojson j = read_json(json_path);
      FP_CHECK(j.is_object() && j.contains("chat_template"), json_path, ": missing field 'chat_template'");
      return ChatTemplate(select_template(j["chat_template"], "default", json_path), special, json_path);
    }
    if (file_exists(cfg_path)) return from_tokenizer_config(cfg_path);
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".gguf") return from_gguf(*GgufFile::open(entry.path().string()));
    return ChatTemplate("", ojson::object(), path + " (no chat template)");
  }
  const fs::path p(path);
  if (p.extension() == ".gguf") return from_gguf(*GgufFile::open(path));
  if (p.filename() == "tokenizer.json") {
    const std::string cfg_path = (p.parent_path() / "tokenizer_config.json").string();
    if (file_exists(cfg_path)) return from_tokenizer_config(cfg_path);
    return ChatTemplate("", ojson::object(), path + " (no chat template)");
  }
  if (p.extension() == ".jinja") return ChatTemplate(read_text(path), ojson::object(), path);
  return from_tokenizer_config(path);
}

}  // namespace fp
